package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// The registry-derived CLI: `doppel a b …` runs the verb a.b of GET /api/registry over tRPC (/trpc/a.b). Nothing here
// names a verb: a verb the server gains is a command with no CLI change.

// DefaultURL is the API a verb is sent to when neither --url nor DOPPEL_URL says otherwise.
const DefaultURL = "http://127.0.0.1:8080"

// VerbOptions configure RunVerb and VerbHelp.
type VerbOptions struct {
	// URL and Key are the defaults of --url and --key (from DOPPEL_URL and DOPPEL_KEY).
	URL, Key string
	// HTTP is the client; nil: one with a 60 s timeout.
	HTTP *http.Client
	// Width is the terminal's width in columns, which tables fit (0: DefaultWidth).
	Width          int
	Stdout, Stderr io.Writer
}

// UsageError is a mistake in the command line: unknown verb, bad flag, missing or refused value (exit 2).
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// APIError is the error a procedure answered with (exit 1).
type APIError struct {
	Verb       string
	HTTPStatus int
	TRPCCode   string
	Detail     string
	Code       string
	RequestID  string
	// Hint says what to do about it, when the CLI knows (a missing or refused key).
	Hint string
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("%s: %s (code %s, HTTP %d %s, requestId %s)", e.Verb, e.Detail, e.Code, e.HTTPStatus, e.TRPCCode, e.RequestID)
	if e.Hint != "" {
		s += "\n" + e.Hint
	}
	return s
}

// UnreachableError: no doppel API answered at URL.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach a doppel server at %s (%v).\nStart one (`doppel dev`), or point the CLI at yours with --url URL or DOPPEL_URL=URL.", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// keyHint is what to do when a call answered 401: send a key, or another one.
func keyHint(key string) string {
	if key == "" {
		return "No workspace key was sent: pass --key mk_live_… or set DOPPEL_KEY (`doppel keys create` mints one; `doppel dev` prints its first)."
	}
	return "The key was refused (unknown, revoked or expired): pass another with --key or DOPPEL_KEY."
}

// ExitCode maps RunVerb's error to the process exit code: 0 ok, 2 usage, 1 anything else.
func ExitCode(err error) int {
	var u *UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return 2
	}
	return 1
}

// Verb is one entry of GET /api/registry.
type Verb struct {
	Name        string         `json:"name"`
	Kind        string         `json:"kind"`
	Method      string         `json:"method"`
	Path        string         `json:"path"`
	Summary     string         `json:"summary"`
	Description string         `json:"description"`
	Credentials []string       `json:"credentials"`
	Input       map[string]any `json:"input"`
}

func (o *VerbOptions) client() *http.Client {
	if o.HTTP != nil {
		return o.HTTP
	}
	return &http.Client{Timeout: 60 * time.Second}
}

// FetchRegistry reads GET /api/registry.
func FetchRegistry(ctx context.Context, hc *http.Client, base, key string) ([]Verb, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/api/registry", nil)
	if err != nil {
		return nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("User-Agent", cliUserAgent)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, &UnreachableError{URL: base, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read the verb registry: %w", err)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return nil, fmt.Errorf("read the verb registry of %s: GET /api/registry answered 401.\n%s", base, keyHint(key))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read the verb registry: GET /api/registry answered %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	var out struct {
		Verbs []Verb `json:"verbs"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("read the verb registry: %w", err)
	}
	return out.Verbs, nil
}

// globals are the flags every verb has: --url, --key, --token, --output.
type globals struct {
	url, key, token, output *string
}

func addGlobals(fs *pflag.FlagSet, o *VerbOptions, taken map[string]bool) globals {
	var g globals
	str := func(name, def, usage string) *string {
		if taken[name] {
			s := def
			return &s
		}
		return fs.String(name, def, usage)
	}
	defURL := o.URL
	if defURL == "" {
		defURL = DefaultURL
	}
	g.url = str("url", defURL, "doppel API URL (DOPPEL_URL)")
	// The key's default is not shown in help: it is applied after parsing when --key is not given.
	g.key = str("key", "", "workspace key mk_live_… (default $DOPPEL_KEY)")
	g.token = str("token", "", "session token ms_…, sent instead of the key (session verbs)")
	g.output = str("output", "", "json, table (fitted to the terminal) or wide (every column) (default: table for a list of objects, json otherwise)")
	return g
}

// prescan reads --url and --key before the registry is known; every other flag is left alone.
func prescan(o *VerbOptions, args []string) (base, key string) {
	fs := pflag.NewFlagSet("doppel", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.ParseErrorsWhitelist.UnknownFlags = true
	fs.Usage = func() {}
	g := addGlobals(fs, o, nil)
	_ = fs.Parse(args)
	return *g.url, cmp.Or(*g.key, o.Key)
}

// RunVerb runs `doppel <args…>` as a registry verb: args[0:k] name the verb, the rest are its positional path
// parameters and flags. `--help` anywhere prints the group's or the verb's help from the registry.
func RunVerb(ctx context.Context, o VerbOptions, args []string) error {
	if len(args) == 0 {
		return &UsageError{"no command"}
	}
	base, key := prescan(&o, args)
	verbs, err := FetchRegistry(ctx, o.client(), base, key)
	if err != nil {
		// The verbs come from the server: without it, no command but the local ones is known.
		return fmt.Errorf("doppel %s: %w", args[0], err)
	}
	v, rest := match(verbs, args)
	if v == nil {
		words := leadingWords(args)
		group := groupOf(verbs, words)
		if len(group) > 0 {
			help := hasHelp(args)
			w := o.Stderr
			if help {
				w = o.Stdout
			}
			printGroup(w, strings.Join(words[:groupDepth(verbs, words)], " "), group)
			if help {
				return nil
			}
			return &UsageError{fmt.Sprintf("unknown verb %q", strings.Join(words, " "))}
		}
		return &UsageError{fmt.Sprintf("unknown command %q (not a local command nor a verb of GET /api/registry; see `doppel help`)", args[0])}
	}
	return runOne(ctx, &o, v, rest)
}

// hasHelp reports whether -h or --help is among the args.
func hasHelp(args []string) bool {
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "help" {
			return true
		}
	}
	return false
}

// leadingWords are the args before the first flag.
func leadingWords(args []string) []string {
	var w []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") || a == "help" {
			break
		}
		w = append(w, a)
	}
	return w
}

// match finds the verb whose dotted name is the longest run of leading args.
func match(verbs []Verb, args []string) (*Verb, []string) {
	var best *Verb
	bestN := 0
	for i := range verbs {
		parts := strings.Split(verbs[i].Name, ".")
		if len(parts) > len(args) || len(parts) <= bestN {
			continue
		}
		ok := true
		for j, p := range parts {
			if args[j] != p {
				ok = false
				break
			}
		}
		if ok {
			best, bestN = &verbs[i], len(parts)
		}
	}
	if best == nil {
		return nil, nil
	}
	return best, args[bestN:]
}

// groupDepth is how many leading words name a group of verbs.
func groupDepth(verbs []Verb, words []string) int {
	for n := len(words); n > 0; n-- {
		prefix := strings.Join(words[:n], ".") + "."
		for _, v := range verbs {
			if strings.HasPrefix(v.Name, prefix) {
				return n
			}
		}
	}
	return 0
}

// groupOf lists the verbs under the longest group the words name.
func groupOf(verbs []Verb, words []string) []Verb {
	n := groupDepth(verbs, words)
	if n == 0 {
		return nil
	}
	prefix := strings.Join(words[:n], ".") + "."
	var out []Verb
	for _, v := range verbs {
		if strings.HasPrefix(v.Name, prefix) {
			out = append(out, v)
		}
	}
	return out
}

func printGroup(w io.Writer, group string, verbs []Verb) {
	fmt.Fprintf(w, "Usage: doppel %s <verb> [args] [flags]\n\nVerbs:\n", group)
	listVerbs(w, verbs)
	fmt.Fprintf(w, "\nRun `doppel %s <verb> --help` for a verb's flags.\n", group)
}

func listVerbs(w io.Writer, verbs []Verb) {
	width := 0
	for _, v := range verbs {
		width = max(width, len(commandOf(v)))
	}
	for _, v := range verbs {
		fmt.Fprintf(w, "  %-*s  %s\n", width, commandOf(v), v.Summary)
	}
}

// commandOf is the command line of a verb: a.b is "a b" followed by its path parameters.
func commandOf(v Verb) string {
	s := strings.ReplaceAll(v.Name, ".", " ")
	for _, p := range pathParams(v.Path) {
		s += " " + strings.ToUpper(p)
	}
	return s
}

// VerbHelp writes the registry's verbs, for `doppel help`.
func VerbHelp(ctx context.Context, o VerbOptions, w io.Writer) error {
	base, key := prescan(&o, nil)
	verbs, err := FetchRegistry(ctx, o.client(), base, key)
	if err != nil {
		return fmt.Errorf("%s: %w", base, err)
	}
	fmt.Fprintf(w, "Verbs (from %s/api/registry, over tRPC; `doppel <group> <verb> --help` for flags):\n", strings.TrimRight(base, "/"))
	listVerbs(w, verbs)
	return nil
}

// pathAliases are the short flags of common path parameters.
var pathAliases = map[string]string{"env": "slug", "session": "session_id"}

func runOne(ctx context.Context, o *VerbOptions, v *Verb, args []string) error {
	list, aliases := props(v)
	fs := pflag.NewFlagSet(v.Name, pflag.ContinueOnError)
	fs.SortFlags = true
	taken := map[string]bool{}
	byName := map[string]*prop{}
	for _, p := range list {
		taken[p.flag] = true
		byName[p.name] = p
	}
	for alias, target := range pathAliases {
		if p, ok := byName[target]; ok && !taken[alias] {
			aliases[alias] = p.flag
		}
	}
	vals := map[string]any{}
	for _, p := range list {
		u := p.usage()
		for a, f := range aliases {
			if f == p.flag && pathAliases[a] != "" {
				u += " (also --" + a + ")"
			}
		}
		switch p.typ {
		case "integer":
			vals[p.flag] = fs.Int64(p.flag, 0, u)
		case "number":
			vals[p.flag] = fs.Float64(p.flag, 0, u)
		case "boolean":
			vals[p.flag] = fs.Bool(p.flag, false, u)
		default:
			vals[p.flag] = fs.String(p.flag, "", u)
		}
	}
	g := addGlobals(fs, o, taken)
	var waitFor *bool
	var every *time.Duration
	if v.Kind == "query" && !taken["wait"] {
		waitFor = fs.Bool("wait", false, "poll until the answer's status is final (a build succeeded or failed), showing its progress; exit 1 when it failed")
		every = fs.Duration("interval", time.Second, "polling interval of --wait")
	}
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if f, ok := aliases[name]; ok {
			return pflag.NormalizedName(f)
		}
		return pflag.NormalizedName(name)
	})
	fs.SetOutput(io.Discard)
	help := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: doppel %s [flags]\n\n", commandOf(*v))
		if v.Summary != "" {
			fmt.Fprintf(w, "%s.", strings.TrimSuffix(v.Summary, "."))
		}
		if v.Description != "" {
			fmt.Fprintf(w, " %s", v.Description)
		}
		fmt.Fprintf(w, "\n\n%s %s (tRPC %s /trpc/%s; REST %s %s)\n\nFlags:\n%s", v.Name, v.Kind, trpcMethod(v), v.Name, v.Method, v.Path, fs.FlagUsages())
	}
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			help(o.Stdout)
			return nil
		}
		return &UsageError{fmt.Sprintf("%s: %v; see `doppel %s --help`", v.Name, err, strings.ReplaceAll(v.Name, ".", " "))}
	}
	input := map[string]any{}
	for _, p := range list {
		if !fs.Changed(p.flag) {
			continue
		}
		switch x := vals[p.flag].(type) {
		case *int64:
			input[p.name] = *x
		case *float64:
			input[p.name] = *x
		case *bool:
			input[p.name] = *x
		case *string:
			val, err := p.value(*x)
			if err != nil {
				return &UsageError{fmt.Sprintf("%s: --%s: %v", v.Name, p.flag, err)}
			}
			input[p.name] = val
		}
		if err := p.checkEnum(input[p.name]); err != nil {
			return &UsageError{fmt.Sprintf("%s: --%s: %v", v.Name, p.flag, err)}
		}
	}
	// Positional arguments fill the path parameters no flag gave, in path order.
	pos := fs.Args()
	for _, name := range pathParams(v.Path) {
		p := byName[name]
		if p == nil || input[name] != nil {
			continue
		}
		if len(pos) == 0 {
			break
		}
		val, err := p.value(pos[0])
		if err != nil {
			return &UsageError{fmt.Sprintf("%s: %s: %v", v.Name, strings.ToUpper(name), err)}
		}
		if err := p.checkEnum(val); err != nil {
			return &UsageError{fmt.Sprintf("%s: %s: %v", v.Name, strings.ToUpper(name), err)}
		}
		input[name] = val
		pos = pos[1:]
	}
	if len(pos) > 0 {
		return &UsageError{fmt.Sprintf("%s: unexpected argument %q; usage: doppel %s [flags]", v.Name, pos[0], commandOf(*v))}
	}
	for _, p := range list {
		if p.req && input[p.name] == nil {
			what := "--" + p.flag
			if p.in == "path" {
				what = strings.ToUpper(p.name) + " (or " + what + ")"
			}
			return &UsageError{fmt.Sprintf("%s: %s is required; see `doppel %s --help`", v.Name, what, strings.ReplaceAll(v.Name, ".", " "))}
		}
	}
	switch *g.output {
	case "", "json", "table", "wide":
	default:
		return &UsageError{fmt.Sprintf("--output %q: json, table or wide", *g.output)}
	}
	auth := cmp.Or(*g.key, o.Key)
	if *g.token != "" {
		auth = *g.token
	}
	poll := func() (json.RawMessage, error) { return call(ctx, o.client(), *g.url, auth, v, input) }
	if waitFor != nil && *waitFor {
		data, err := wait(ctx, *every, o.Stderr, strings.ReplaceAll(v.Name, ".", " "), poll)
		if err != nil {
			return err
		}
		if err := render(o.Stdout, data, *g.output, o.Width); err != nil {
			return err
		}
		if status, _, _ := progressOf(data); failedStatus[status] {
			return fmt.Errorf("%s: finished with status %s", v.Name, status)
		}
		return nil
	}
	data, err := poll()
	if ae := (*APIError)(nil); errors.As(err, &ae) && ae.HTTPStatus == http.StatusUnauthorized {
		ae.Hint = keyHint(auth)
	}
	if err != nil {
		return err
	}
	return render(o.Stdout, data, *g.output, o.Width)
}

func trpcMethod(v *Verb) string {
	if v.Kind == "query" {
		return http.MethodGet
	}
	return http.MethodPost
}
