package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/jedib0t/go-pretty/v6/table"

	"github.com/doppel-dev/doppel/api"
)

// usageBarWidth is the width of a meter's bar, in cells.
const usageBarWidth = 24

func runUsage(ctx context.Context, e env) error {
	fs, url, key := clientFlagSet(e, "usage", "usage [--json]")
	asJSON := fs.Bool("json", false, "print GET /v1/usage's JSON instead of the table")
	if err := parseClient(fs, e.args); err != nil {
		if errors.Is(err, errHelp) {
			return nil
		}
		return err
	}
	c, err := newAPIClient(*url, *key)
	if err != nil {
		return err
	}
	var out api.UsageBody
	if err := c.do(ctx, http.MethodGet, "/v1/usage", nil, &out); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	renderUsage(e.stdout, out, progress.StyleCharsBlocks)
	return nil
}

// renderUsage writes the period, the plan and a row per meter with a bar of its use against its limit.
func renderUsage(w io.Writer, u api.UsageBody, chars progress.StyleChars) {
	plan := u.Plan
	if plan == "" {
		plan = "(none: no limits)"
	}
	card := "no"
	if u.CardOnFile {
		card = "yes"
	}
	fmt.Fprintf(w, "Period %s – %s (UTC)   plan %s   card on file: %s\n", u.PeriodStart.Format("2006-01-02"), u.PeriodEnd.Format("2006-01-02"), plan, card)
	fmt.Fprintf(w, "Task-minutes: %s of %s (%d seconds)\n\n", num(u.TaskMinutes.Used), limitText(u.TaskMinutes.Limit), u.TaskMinutes.Seconds)
	tw := table.NewWriter()
	tw.SetOutputMirror(w)
	tw.SetStyle(table.StyleLight)
	tw.AppendHeader(table.Row{"Meter", "Used", "Limit", "Unit", "", ""})
	for _, m := range u.Meters {
		name := m.Name
		if m.Env != "" {
			name += " (" + m.Env + ")"
		}
		b, pct := bar(m.Used, m.Limit, chars)
		tw.AppendRow(table.Row{name, num(m.Used), limitText(m.Limit), m.Unit, b, pct})
	}
	tw.Render()
}

// bar draws used against limit, usageBarWidth cells wide; no limit draws no bar.
func bar(used float64, limit *float64, chars progress.StyleChars) (string, string) {
	if limit == nil || *limit <= 0 {
		return "", "no limit"
	}
	frac := used / *limit
	cells := int(math.Round(math.Min(frac, 1) * usageBarWidth))
	if cells == 0 && used > 0 {
		cells = 1 // any use shows
	}
	return chars.BoxLeft + strings.Repeat(chars.Finished, cells) + strings.Repeat(chars.Unfinished, usageBarWidth-cells) + chars.BoxRight,
		strconv.FormatFloat(math.Floor(frac*1000)/10, 'f', -1, 64) + "%"
}

func limitText(l *float64) string {
	if l == nil {
		return "-"
	}
	return num(*l)
}

// num prints a meter amount: whole numbers as such, others to two decimals.
func num(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
