package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/doppel-dev/doppel/config"
)

// apiClient talks to a running doppel API with a workspace key.
type apiClient struct {
	url  string
	key  string
	http *http.Client
}

// clientFlags registers --url and --key, defaulting to DOPPEL_URL and DOPPEL_KEY (or DOPPEL_BOOTSTRAP_KEY).
func clientFlags(fs *pflag.FlagSet, e env) (url, key *string) {
	get := func(names ...string) string {
		for _, n := range names {
			if v := config.Lookup(e.environ, n); v != "" {
				return v
			}
		}
		return ""
	}
	defURL := get("DOPPEL_URL")
	if defURL == "" {
		defURL = "http://127.0.0.1:8080"
	}
	url = fs.String("url", defURL, "doppel API URL (DOPPEL_URL)")
	key = fs.String("key", get("DOPPEL_KEY", "DOPPEL_BOOTSTRAP_KEY"), "workspace key mk_live_… (DOPPEL_KEY)")
	return url, key
}

func newAPIClient(url, key string) (*apiClient, error) {
	if key == "" {
		return nil, usageError{"no workspace key: pass --key or set DOPPEL_KEY"}
	}
	return &apiClient{url: strings.TrimRight(url, "/"), key: key, http: &http.Client{Timeout: 60 * time.Second}}, nil
}

// apiError is an error envelope the API answered with.
type apiError struct {
	Status    int    `json:"-"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	RequestID string `json:"requestId"`
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%d %s: %s (request %s)", e.Status, e.Code, e.Detail, e.RequestID)
}

// do sends a JSON request and decodes a JSON answer into out (when not nil).
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		ae := &apiError{Status: resp.StatusCode}
		if json.Unmarshal(data, ae) != nil || ae.Detail == "" {
			ae.Detail = strings.TrimSpace(string(data))
		}
		return ae
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// printJSON writes v indented.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
