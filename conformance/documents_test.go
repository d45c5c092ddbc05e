package conformance

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
)

// The documents the server serves, as cmd/doppel's TestOpenAPIGoldens keeps them.
var documents = []struct{ name, file, version string }{
	{"3.1", "../cmd/doppel/testdata/openapi-3.1.golden.json", "3.1"},
	{"3.0", "../cmd/doppel/testdata/openapi-3.0.golden.json", "3.0.3"},
}

func readDocument(t testing.TB, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Both documents are valid OpenAPI by kin-openapi's validator (its default, strict options: no extra sibling
// fields, examples and defaults checked) and by libopenapi-validator's document validation.
func TestDocumentsValidate(t *testing.T) {
	for _, d := range documents {
		t.Run(d.name, func(t *testing.T) {
			data := readDocument(t, d.file)

			loader := openapi3.NewLoader()
			doc, err := loader.LoadFromData(data)
			if err != nil {
				t.Fatalf("kin-openapi cannot load %s: %v", d.file, err)
			}
			if doc.OpenAPI[:len(d.version)] != d.version {
				t.Fatalf("%s is OpenAPI %s, want %s", d.file, doc.OpenAPI, d.version)
			}
			if err := doc.Validate(context.Background(), openapi3.EnableMultiError()); err != nil {
				t.Errorf("kin-openapi: %s is not valid OpenAPI %s:\n%v", d.file, doc.OpenAPI, err)
			}

			ldoc, err := libopenapi.NewDocument(data)
			if err != nil {
				t.Fatalf("libopenapi cannot read %s: %v", d.file, err)
			}
			v, errs := validator.NewValidator(ldoc)
			if len(errs) > 0 {
				t.Fatalf("libopenapi-validator cannot build a validator for %s: %v", d.file, errs)
			}
			if ok, verrs := v.ValidateDocument(); !ok {
				for _, e := range verrs {
					t.Errorf("libopenapi-validator: %s: %s (%s)", d.file, e.Message, e.Reason)
					for _, se := range e.SchemaValidationErrors {
						t.Errorf("  at %s: %s", se.FieldPath+" "+se.KeywordLocation, se.Reason)
					}
				}
			}
			t.Logf("%s: %d paths, valid by kin-openapi and libopenapi-validator", d.file, doc.Paths.Len())
		})
	}
}
