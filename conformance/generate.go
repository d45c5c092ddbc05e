// Package conformance holds clients generated from doppel's OpenAPI documents by generators nobody here wrote, and
// tests that run them against a real doppel (conformance_test.go). It is its own Go module, so the generators and
// their runtimes stay out of doppel's dependency graph; `go test ./...` at the repository root does not enter it
// (.ci/run runs it, see docs/testing.md).
//
// The documents are the goldens cmd/doppel's TestOpenAPIGoldens keeps equal to what the server serves. After they
// change, regenerate with `go generate` here; TestGeneratedCodeCurrent fails until then.
package conformance

//go:generate go tool ogen -config ogen.yml -package ogen31 -target ogen31 -clean ../cmd/doppel/testdata/openapi-3.1.golden.json
//go:generate go tool ogen -config ogen.yml -package ogen30 -target ogen30 -clean ../cmd/doppel/testdata/openapi-3.0.golden.json
//go:generate go tool oapi-codegen -generate types,client -package oapi30 -o oapi30/client.gen.go ../cmd/doppel/testdata/openapi-3.0.golden.json
