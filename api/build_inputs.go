package api

import (
	"fmt"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/schema"
)

// uploadReader reads a workspace's upload referenced by form field field.
type uploadReader func(field, id string) (*schema.Upload, []byte, error)

type codeFile struct {
	filename string
	data     []byte
}

// buildUploadRefs are the build inputs a form names by upload id.
type buildUploadRefs struct {
	tools, config []byte
	code          []codeFile
}

// uploadRefs reads the uploads the build form names: tools_upload and config_upload (one each) and code_upload (one
// per tool, the upload's filename naming it, as a code part's does).
func uploadRefs(form huma.MultipartFormFiles[BuildForm], read uploadReader) (buildUploadRefs, error) {
	var refs buildUploadRefs
	if form.Form == nil {
		return refs, nil
	}
	vals := form.Form.Value
	one := func(field string) ([]byte, error) {
		ids := vals[field]
		switch {
		case len(ids) == 0:
			return nil, nil
		case len(ids) > 1:
			return nil, Invalid("body."+field, "given more than once")
		}
		_, data, err := read("body."+field, strings.TrimSpace(ids[0]))
		return data, err
	}
	var err error
	if refs.tools, err = one("tools_upload"); err != nil {
		return refs, err
	}
	if refs.config, err = one("config_upload"); err != nil {
		return refs, err
	}
	for i, id := range vals["code_upload"] {
		u, data, err := read(fmt.Sprintf("body.code_upload[%d]", i), strings.TrimSpace(id))
		if err != nil {
			return refs, err
		}
		refs.code = append(refs.code, codeFile{u.Filename, data})
	}
	return refs, nil
}
