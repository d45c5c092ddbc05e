package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// pending are the status values of something still under way (a build queued or running, an environment building).
var pending = map[string]bool{"queued": true, "pending": true, "running": true, "building": true, "starting": true, "booting": true}

// failedStatus are final status values that make --wait exit 1.
var failedStatus = map[string]bool{"failed": true, "canceled": true, "cancelled": true}

// progressOf reads status, stage and progress (0–1, -1 when absent) from an answer.
func progressOf(data json.RawMessage) (status, stage string, progress float64) {
	var a struct {
		Status   string   `json:"status"`
		Stage    string   `json:"stage"`
		Progress *float64 `json:"progress"`
	}
	progress = -1
	if json.Unmarshal(data, &a) != nil {
		return "", "", -1
	}
	if a.Progress != nil {
		progress = math.Max(0, math.Min(1, *a.Progress))
	}
	return a.Status, a.Stage, progress
}

// wait polls a query verb until its answer's status is no longer pending, drawing its progress on stderr (a bar on a
// terminal, a line per change otherwise), and returns the last answer.
func wait(ctx context.Context, every time.Duration, stderr io.Writer, name string, poll func() (json.RawMessage, error)) (json.RawMessage, error) {
	data, err := poll()
	if err != nil {
		return nil, err
	}
	status, stage, progress := progressOf(data)
	if !pending[status] {
		return data, nil
	}
	var mu sync.Mutex
	label := func() string {
		mu.Lock()
		defer mu.Unlock()
		if stage != "" {
			return status + " · " + stage
		}
		return status
	}
	const total = 1000
	var bar *mpb.Bar
	var p *mpb.Progress
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) && termWidth(f) > 0 {
		p = mpb.NewWithContext(ctx, mpb.WithOutput(stderr), mpb.WithWidth(40), mpb.WithRefreshRate(150*time.Millisecond))
		bar = p.AddBar(total,
			mpb.PrependDecorators(decor.Name(name+" "), decor.Any(func(decor.Statistics) string { return label() }, decor.WCSyncSpaceR)),
			mpb.AppendDecorators(decor.Percentage(decor.WC{W: 5}), decor.Name(" "), decor.Elapsed(decor.ET_STYLE_GO)))
	}
	last := ""
	show := func() {
		if bar != nil {
			if progress >= 0 {
				bar.SetCurrent(int64(progress * total))
			}
			return
		}
		line := label()
		if progress >= 0 {
			line += fmt.Sprintf(" %3.0f%%", progress*100)
		}
		if line != last {
			fmt.Fprintf(stderr, "%s: %s\n", name, line)
			last = line
		}
	}
	finish := func(ok bool) {
		if bar != nil {
			if ok {
				bar.SetCurrent(total)
			} else {
				bar.Abort(false)
			}
			p.Wait()
		}
	}
	show()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			finish(false)
			return nil, ctx.Err()
		case <-t.C:
		}
		d, err := poll()
		if err != nil {
			finish(false)
			return nil, err
		}
		data = d
		mu.Lock()
		status, stage, progress = progressOf(data)
		mu.Unlock()
		if !pending[status] {
			finish(!failedStatus[status])
			if bar == nil {
				fmt.Fprintf(stderr, "%s: %s\n", name, status)
			}
			return data, nil
		}
		show()
	}
}

// termWidth is the terminal's width, 0 when unknown (a pty nobody sized draws no bar).
func termWidth(f *os.File) int {
	w, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return w
}
