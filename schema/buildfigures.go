package schema

import (
	"encoding/json"
	"fmt"
)

// BuildFigures is the summary a succeeded build keeps on its row (builds.report) and the build route shows, in snake_case
// (the build activities' results, recorded in workflow histories, keep their own encoding).
type BuildFigures struct {
	Inferred  InferredFigures  `json:"inferred"`
	SelfCheck SelfCheckFigures `json:"self_check"`
}

// InferredFigures summarise inference.
type InferredFigures struct {
	BundleKey    string  `json:"bundle_key" doc:"Blob key of the bundle."`
	BundleHash   string  `json:"bundle_hash"`
	ReportKey    string  `json:"report_key" doc:"Blob key of the full inference report."`
	NTools       int     `json:"n_tools"`
	SchemaSource string  `json:"schema_source" doc:"traces, or provided when tool definitions were uploaded."`
	Warnings     int     `json:"warnings" doc:"Messy-input warnings counted by the inference report."`
	CoveredPct   float64 `json:"covered_pct"`
	SimulatedPct float64 `json:"simulated_pct"`
	Headline     string  `json:"headline"`
}

// SelfCheckFigures summarise the leave-one-out self-check.
type SelfCheckFigures struct {
	ReportKey    string  `json:"report_key" doc:"Blob key of the full self-check report."`
	AgreementPct float64 `json:"agreement_pct" doc:"Percentage of scored calls whose answer equalled the recorded one."`
	Calls        int     `json:"calls"`
	Headline     string  `json:"headline"`
}

// DecodeBuildFigures reads a build row's summary: snake_case, or as rows finished before it had its own names
// stored it ({"inferred": {"BundleKey": …}, "selfCheck": {"Agreement": …}}, the Go field names).
func DecodeBuildFigures(data []byte) (*BuildFigures, error) {
	var probe struct {
		Legacy json.RawMessage `json:"selfCheck"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("build summary: %w", err)
	}
	if probe.Legacy == nil {
		var f BuildFigures
		if err := json.Unmarshal(data, &f); err != nil {
			return nil, fmt.Errorf("build summary: %w", err)
		}
		return &f, nil
	}
	var legacy struct {
		Inferred struct {
			BundleKey, BundleHash, ReportKey, SchemaSource, Headline string
			NTools, Warnings                                         int
			CoveredPct, SimulatedPct                                 float64
		} `json:"inferred"`
		SelfChecked struct {
			ReportKey, Headline string
			Agreement           float64
			Calls               int
		} `json:"selfCheck"`
	}
	if err := json.Unmarshal(data, &legacy); err != nil {
		return nil, fmt.Errorf("build summary: %w", err)
	}
	inf, chk := legacy.Inferred, legacy.SelfChecked
	return &BuildFigures{
		Inferred: InferredFigures{BundleKey: inf.BundleKey, BundleHash: inf.BundleHash, ReportKey: inf.ReportKey,
			NTools: inf.NTools, SchemaSource: inf.SchemaSource, Warnings: inf.Warnings, CoveredPct: inf.CoveredPct,
			SimulatedPct: inf.SimulatedPct, Headline: inf.Headline},
		SelfCheck: SelfCheckFigures{ReportKey: chk.ReportKey, AgreementPct: chk.Agreement, Calls: chk.Calls, Headline: chk.Headline},
	}, nil
}
