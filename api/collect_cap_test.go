package api_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/schema"
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

// A body over the request cap answers 413 whether or not it declares its length, and stores nothing; a body of
// exactly the cap is read whole. Bodies are read into buffers that serve later requests: each reads as its own.
func TestCollectRequestCap(t *testing.T) {
	_, retail := readCollectData(t, "tau-retail-dev.json")
	atCap := collectBody("shop", retail.Traces[:2], "")
	fx := newCollectFx(t, schema.DriverSQLite, api.CollectOptions{MaxRequestBytes: int64(len(atCap))}, nil)
	over := collectBody("shop", retail.Traces[:3], "")
	for name, r := range map[string]io.Reader{"declared": bytes.NewReader(over), "chunked": io.MultiReader(bytes.NewReader(over))} {
		reply := fx.postFrom(t, r)
		reply.want(t, http.StatusRequestEntityTooLarge)
		if reply.body["code"] != api.CodeTooLarge {
			t.Errorf("%s: envelope %v", name, reply.body)
		}
	}
	if rc := fx.rows(t); rc != (rowCount{}) {
		t.Fatalf("a refused body wrote rows: %+v", rc)
	}
	reply := fx.postFrom(t, io.MultiReader(bytes.NewReader(atCap)))
	reply.want(t, http.StatusAccepted)
	if reply.num("accepted") != 2 {
		t.Fatalf("body at the cap: %v", reply.body)
	}
	for i := 2; i < 6; i++ { // shorter bodies after a longer one, in the buffers it left
		reply = fx.post(t, collectBody("shop", retail.Traces[i:i+1], ""))
		reply.want(t, http.StatusAccepted)
		if reply.num("accepted") != 1 {
			t.Fatalf("traces[%d]: %v", i, reply.body)
		}
	}
	if env := fx.env(t, "shop"); env.NTraces != 6 {
		t.Fatalf("n_traces %d, want 6", env.NTraces)
	}
}
