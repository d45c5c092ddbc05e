package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

// Issue #13: every command's --help prints its usage and exits 0, and flags show their value types.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"dev", "--help"}, {"serve", "-h"}, {"worker", "--help"}, {"migrate", "--help"},
		{"keys", "--help"}, {"keys", "-h"}, {"keys", "help"}, {"keys", "create", "--help"}, {"collect", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if err := run(context.Background(), args, nil, &out, &errb); err != nil {
				t.Fatalf("err = %v (exit non-zero)\n%s%s", err, out.String(), errb.String())
			}
			help := out.String() + errb.String()
			if !strings.Contains(help, "Usage: doppel "+args[0]) {
				t.Errorf("no usage:\n%s", help)
			}
		})
	}
	var errb bytes.Buffer
	if err := run(context.Background(), []string{"dev", "--help"}, nil, &bytes.Buffer{}, &errb); err != nil {
		t.Fatal(err)
	}
	// pflag shows a flag's type after its name: "--temporal-address string", never words of its help.
	typed := regexp.MustCompile(`(?m)^\s+--([a-z-]+) (\S+(?: \S+)?)\s{2,}`)
	seen := 0
	for _, m := range typed.FindAllStringSubmatch(errb.String(), -1) {
		seen++
		switch m[2] {
		case "string", "int", "int64", "float", "duration", "bytes":
		default:
			t.Errorf("--%s is typed %q", m[1], m[2])
		}
	}
	if seen < 10 {
		t.Errorf("only %d typed flags in:\n%s", seen, errb.String())
	}
}
