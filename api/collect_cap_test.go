package api_test

import (
	"net/http"
	"testing"

	"github.com/doppel-dev/doppel/api"
)

// Issue #13: traces the environment already holds never count against its byte cap. A resent batch always answers
// 202 with its duplicates, however full the environment is; a batch mixing held and new traces is charged for
// the new ones only.
func TestCollectDuplicatesNeverCountAgainstTheCap(t *testing.T) {
	for _, be := range collectBackends {
		t.Run(be.name, func(t *testing.T) {
			_, retail := readCollectData(t, "tau-retail-dev.json")
			first := collectBody("shop", retail.Traces[:10], "")
			eleventh := collectBody("shop", retail.Traces[10:11], "")
			limit := int64(len(first)) + int64(len(eleventh)) + 100 // room for the eleventh trace, not for eleven
			fx := newCollectFx(t, be.driver, api.CollectOptions{MaxEnvBytes: limit}, nil)
			fx.post(t, first).want(t, http.StatusAccepted)

			r := fx.post(t, first) // the collector's retry after a timeout
			r.want(t, http.StatusAccepted)
			if r.num("accepted") != 0 || r.num("duplicates") != 10 {
				t.Errorf("resent batch: %v, want 0 accepted and 10 duplicates", r.body)
			}
			// The ten held traces and one new one: only the new one's bytes count, and they fit.
			mixed := collectBody("shop", retail.Traces[:11], "")
			r = fx.post(t, mixed)
			r.want(t, http.StatusAccepted)
			if r.num("accepted") != 1 || r.num("duplicates") != 10 {
				t.Errorf("mixed batch: %v, want 1 accepted and 10 duplicates", r.body)
			}
			env := fx.env(t, "shop")
			if env.NTraces != 11 || env.CollectedBytes > limit || env.CollectedBytes <= int64(len(first)) {
				t.Errorf("env after the mixed batch: n_traces %d, collected %d bytes (first batch %d, cap %d)",
					env.NTraces, env.CollectedBytes, len(first), limit)
			}
			fx.post(t, mixed).want(t, http.StatusAccepted) // full now, and still a resend is fine
			// A new trace past the cap is refused, and changes nothing.
			r = fx.post(t, collectBody("shop", retail.Traces[11:12], ""))
			r.want(t, http.StatusRequestEntityTooLarge)
			if after := fx.env(t, "shop"); after.NTraces != 11 || after.CollectedBytes != env.CollectedBytes {
				t.Errorf("the refused batch changed the env: n_traces %d, collected %d", after.NTraces, after.CollectedBytes)
			}
		})
	}
}
