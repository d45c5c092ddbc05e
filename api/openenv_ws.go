package api

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gorilla/websocket"
)

// OpenEnv's WebSocket error codes (WSErrorCode).
const (
	wsInvalidJSON     = "INVALID_JSON"
	wsUnknownType     = "UNKNOWN_TYPE"
	wsValidationError = "VALIDATION_ERROR"
	wsExecutionError  = "EXECUTION_ERROR"
	wsCapacityReached = "CAPACITY_REACHED"
)

// wsMaxMessage bounds one client message (OpenEnv's client allows 100 MB; an action is far smaller).
const wsMaxMessage = 16 << 20

var upgrader = websocket.Upgrader{
	ReadBufferSize: 4096, WriteBufferSize: 4096,
	// Any origin: the credential is the Authorization header, which a browser cannot set on a WebSocket.
	CheckOrigin: func(*http.Request) bool { return true },
}

// wsMessage is a client message: reset, step, state or close.
type wsMessage struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// websocket is /ws: one connection, one episode at a time, one doppel session per episode. reset opens the
// session (a second reset closes it and opens another); step runs an action; state answers the state; close (or
// the connection ending) closes the session.
func (o *OpenEnvRoutes) websocket(w http.ResponseWriter, r *http.Request, e *oeEnv) {
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered the handshake's error
	}
	defer conn.Close()
	conn.SetReadLimit(wsMaxMessage)
	if n := o.active.Add(1); n > int64(o.MaxConcurrent) {
		o.active.Add(-1)
		_ = conn.WriteJSON(map[string]any{"type": "error", "data": map[string]any{
			"message": "the server is serving its most WebSocket episodes at once", "code": wsCapacityReached,
			"active_sessions": n - 1, "max_sessions": o.MaxConcurrent}})
		return
	}
	defer o.active.Add(-1)
	// The request's context ends when the handler returns; the episode's work uses its own, with the principal.
	ctx := context.WithoutCancel(r.Context())
	ep := &oeEpisode{routes: o, env: e}
	defer func() { ep.end(ctx) }()
	for {
		_, raw, err := conn.ReadMessage()
		if err != nil {
			return
		}
		reply, stop := o.wsHandle(ctx, ep, raw)
		if stop {
			return
		}
		_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if err := conn.WriteJSON(reply); err != nil {
			return
		}
	}
}

// wsHandle answers one client message; stop is true after close.
func (o *OpenEnvRoutes) wsHandle(ctx context.Context, ep *oeEpisode, raw []byte) (reply map[string]any, stop bool) {
	ctx = newRequest(ctx, o.logger)
	var msg wsMessage
	if err := json.Unmarshal(raw, &msg); err != nil {
		return wsError("Invalid JSON: "+err.Error(), wsInvalidJSON, nil), false
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(raw, &fields)
	extra := func(allowed ...string) error {
		for k := range fields {
			ok := false
			for _, a := range allowed {
				ok = ok || a == k
			}
			if !ok {
				return Invalid(k, "extra fields not permitted")
			}
		}
		return nil
	}
	var out map[string]any
	var err error
	switch msg.Type {
	case "reset":
		if err = extra("type", "data"); err == nil {
			var data map[string]any
			if len(msg.Data) > 0 && string(msg.Data) != "null" {
				if json.Unmarshal(msg.Data, &data) != nil {
					err = Invalid("data", "expected an object of reset parameters")
				}
			}
			if err == nil {
				out, err = ep.reset(ctx, data, "data")
			}
		}
		if err == nil {
			return map[string]any{"type": "observation", "data": out}, false
		}
	case "step":
		if err = extra("type", "data"); err == nil {
			if len(msg.Data) == 0 {
				err = Invalid("data", "required: the action")
			} else {
				var a *oeAction
				if a, err = parseAction(msg.Data, "data"); err == nil {
					out, err = ep.step(ctx, a)
				}
			}
		}
		if err == nil {
			return map[string]any{"type": "observation", "data": out}, false
		}
	case "state":
		if err = extra("type"); err == nil {
			out, err = ep.state(ctx)
		}
		if err == nil {
			return map[string]any{"type": "state", "data": out}, false
		}
	case "close":
		if err = extra("type"); err == nil {
			return nil, true
		}
	default:
		return wsError("Unknown message type: "+msg.Type, wsUnknownType, nil), false
	}
	env, status := EnvelopeOf(ctx, err)
	code := wsExecutionError
	if status == http.StatusUnprocessableEntity {
		code = wsValidationError
	}
	return wsError(env.Detail, code, env), false
}

// wsError is OpenEnv's WSErrorResponse, with doppel's envelope (its status, code and field) beside.
func wsError(message, code string, env *Envelope) map[string]any {
	data := map[string]any{"message": message, "code": code}
	if env != nil {
		data["envelope"] = env
		data["status"] = env.status
	}
	return map[string]any{"type": "error", "data": data}
}
