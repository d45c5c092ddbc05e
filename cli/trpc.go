package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// call sends the verb over tRPC and returns result.data, or an *APIError.
func call(ctx context.Context, hc *http.Client, base, auth string, v *Verb, input map[string]any) (json.RawMessage, error) {
	in, err := json.Marshal(input)
	if err != nil {
		return nil, err
	}
	u := strings.TrimRight(base, "/") + "/trpc/" + url.PathEscape(v.Name)
	var body io.Reader
	method := trpcMethod(v)
	if method == http.MethodGet {
		if len(input) > 0 {
			u += "?input=" + url.QueryEscape(string(in))
		}
	} else {
		body = bytes.NewReader(in)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	req.Header.Set("User-Agent", cliUserAgent)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", v.Name, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: read answer: %w", v.Name, err)
	}
	var res struct {
		Result *struct {
			Data json.RawMessage `json:"data"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
			Data    struct {
				Code       string `json:"code"`
				HTTPStatus int    `json:"httpStatus"`
				Envelope   *struct {
					Detail    string `json:"detail"`
					Code      string `json:"code"`
					RequestID string `json:"requestId"`
				} `json:"envelope"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &res); err != nil || (res.Result == nil && res.Error == nil) {
		return nil, &APIError{Verb: v.Name, HTTPStatus: resp.StatusCode, Detail: strings.TrimSpace(string(raw)), Code: "-", RequestID: "-"}
	}
	if e := res.Error; e != nil {
		ae := &APIError{Verb: v.Name, HTTPStatus: e.Data.HTTPStatus, TRPCCode: e.Data.Code, Detail: e.Message}
		if ae.HTTPStatus == 0 {
			ae.HTTPStatus = resp.StatusCode
		}
		if env := e.Data.Envelope; env != nil {
			ae.Detail, ae.Code, ae.RequestID = env.Detail, env.Code, env.RequestID
		}
		return nil, ae
	}
	return res.Result.Data, nil
}
