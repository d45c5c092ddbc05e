package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/schema"
)

// Defaults of UploadRoutes.
const (
	DefaultUploadMaxFileBytes = 32 << 20
	DefaultUploadMaxFiles     = 16
	uploadsPath               = "/api/uploads"
	uploadBlobPrefix          = "uploads"
	maxFilenameLen            = 255
)

// UploadRoutes serve POST /api/uploads: files stored content-addressed in the blob store, referenced by id
// (upl_…) from builds (tools_upload, code_upload, config_upload) and collect ({"project", "upload"}).
type UploadRoutes struct {
	Blobs blob.Store
	// MaxFileBytes caps each file (default 32 MiB); a larger one answers 413 and nothing is stored.
	MaxFileBytes int64
	// MaxFiles caps the files of one request (default 16).
	MaxFiles int
}

// UploadInfo is a stored upload.
type UploadInfo struct {
	ID          string `json:"id" doc:"Prefixed upl_; reference it from builds and collect." example:"upl_0123456789abcdef"`
	Filename    string `json:"filename"`
	ContentType string `json:"content_type"`
	Bytes       int64  `json:"bytes"`
	SHA256      string `json:"sha256" doc:"Hex SHA-256 of the content (its blob is keyed by it)."`
}

// UploadsAccepted is the answer of POST /api/uploads.
type UploadsAccepted struct {
	Uploads []UploadInfo `json:"uploads" doc:"One per file part, in order."`
}

// Register adds POST /api/uploads to the mux and documents it.
func (ur *UploadRoutes) Register(a huma.API, d *Deps) {
	if ur.MaxFileBytes <= 0 {
		ur.MaxFileBytes = DefaultUploadMaxFileBytes
	}
	if ur.MaxFiles <= 0 {
		ur.MaxFiles = DefaultUploadMaxFiles
	}
	d.BodyCap("POST "+uploadsPath, int64(ur.MaxFiles)*(ur.MaxFileBytes+64<<10))
	d.Mux.HandleFunc("POST "+uploadsPath, func(w http.ResponseWriter, r *http.Request) {
		out, err := ur.handle(w, r, d)
		if err != nil {
			WriteError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(out)
	})
	ur.document(a)
}

var typeOfUploadsAccepted = reflect.TypeOf(UploadsAccepted{})

type pendingUpload struct {
	row  schema.Upload
	data []byte
}

func (ur *UploadRoutes) handle(w http.ResponseWriter, r *http.Request, d *Deps) (*UploadsAccepted, error) {
	ctx := r.Context()
	p, err := d.Auth.Workspace(ctx, r.Header.Get("Authorization"))
	if err != nil {
		var e *Envelope
		if !errors.As(err, &e) {
			return nil, Unavailable("the metadata database is not answering; nothing was stored, retry")
		}
		return nil, err
	}
	if ur.Blobs == nil || d.DB == nil {
		return nil, Unavailable("uploads are not configured with a blob store and a database")
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, Errorf(http.StatusUnsupportedMediaType, "the body must be multipart/form-data with one or more file parts named file")
	}
	// The whole body can be no larger than its files and a little framing.
	r.Body = http.MaxBytesReader(w, r.Body, int64(ur.MaxFiles)*(ur.MaxFileBytes+64<<10))
	mr := multipart.NewReader(r.Body, params["boundary"])
	var files []pendingUpload
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, bodyError(err)
		}
		f, err := ur.readPart(part, len(files))
		_ = part.Close()
		if err != nil {
			return nil, err
		}
		// Stored now, so one file at a time is in memory. The rows below make the uploads exist, all or none; a
		// blob whose request then fails is content-addressed and stored again, not twice, when it is resent.
		key, err := blob.PutContent(ctx, ur.Blobs, uploadBlobPrefix+"/"+p.Workspace.ID, f.data, f.row.ContentType)
		if err != nil {
			loggerFrom(ctx).WarnContext(ctx, "uploads: blob store", slog.Any("error", err))
			return nil, Unavailable("the blob store is not answering; nothing was stored, retry")
		}
		f.row.BlobKey, f.row.WorkspaceID, f.data = key, p.Workspace.ID, nil
		files = append(files, *f)
	}
	if len(files) == 0 {
		return nil, Invalid("body.file", "no file part: send one or more parts named file, each with a filename")
	}
	out := &UploadsAccepted{}
	rows := make([]*schema.Upload, len(files))
	for i := range files {
		rows[i] = &files[i].row
	}
	if err := (&control.Uploads{DB: d.DB}).Record(ctx, rows); err != nil {
		return nil, err
	}
	for _, f := range files {
		out.Uploads = append(out.Uploads, UploadInfo{ID: f.row.ID, Filename: f.row.Filename, ContentType: f.row.ContentType,
			Bytes: f.row.Bytes, SHA256: f.row.SHA256})
	}
	return out, nil
}

// bodyError answers a body that could not be read: 413 past the request's cap, else 422.
func bodyError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return TooLarge("the request is over %d bytes", mbe.Limit)
	}
	return Invalid("body", "malformed multipart body: "+err.Error())
}

func (ur *UploadRoutes) readPart(part *multipart.Part, i int) (*pendingUpload, error) {
	loc := fmt.Sprintf("body.file[%d]", i)
	if part.FormName() != "file" {
		return nil, Invalid("body."+safeName(part.FormName()), "unknown part: send parts named file")
	}
	if i >= ur.MaxFiles {
		return nil, TooLarge("more than %d files in one request", ur.MaxFiles)
	}
	name := path.Base(strings.ReplaceAll(part.FileName(), "\\", "/"))
	if name == "" || name == "." || name == "/" {
		return nil, Invalid(loc, "each file part needs a filename")
	}
	if len(name) > maxFilenameLen || !utf8.ValidString(name) {
		return nil, Invalid(loc, fmt.Sprintf("the filename must be UTF-8 of at most %d bytes", maxFilenameLen))
	}
	ct := part.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/octet-stream"
	}
	if _, _, err := mime.ParseMediaType(ct); err != nil || len(ct) > 255 {
		return nil, Invalid(loc, "the part's Content-Type is not a media type")
	}
	data, err := io.ReadAll(io.LimitReader(part, ur.MaxFileBytes+1))
	if err != nil {
		return nil, bodyError(err)
	}
	if int64(len(data)) > ur.MaxFileBytes {
		return nil, TooLarge("file %s is over the %d-byte limit of one upload", name, ur.MaxFileBytes)
	}
	sum := sha256.Sum256(data)
	return &pendingUpload{data: data, row: schema.Upload{SHA256: hex.EncodeToString(sum[:]), Filename: name,
		ContentType: ct, Bytes: int64(len(data))}}, nil
}

// safeName keeps a part name printable and short for an error location.
func safeName(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) > 64 {
		s = s[:64]
	}
	if !utf8.ValidString(s) || s == "" {
		return "part"
	}
	return s
}

// readUpload returns a workspace's upload and its content; a missing one (or another workspace's) is a 422 at
// field, which referenced it.
func readUpload(ctx context.Context, db bun.IDB, blobs blob.Store, ws, id, field string) (*schema.Upload, []byte, error) {
	u, err := (&control.Uploads{DB: db}).Get(ctx, ws, id, field)
	if err != nil {
		return nil, nil, mapError(err)
	}
	rc, err := blobs.Get(ctx, u.BlobKey)
	if err != nil {
		return nil, nil, Unavailable("blob %s: %s", u.BlobKey, withoutPaths(err))
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, nil, Unavailable("blob %s: %s", u.BlobKey, withoutPaths(err))
	}
	return u, data, nil
}

func (ur *UploadRoutes) document(a huma.API) {
	oapi := a.OpenAPI()
	env := oapi.Components.Schemas.Schema(typeOfEnvelope, true, "Envelope")
	ok := oapi.Components.Schemas.Schema(typeOfUploadsAccepted, true, "UploadsAccepted")
	errResp := func(desc string) *huma.Response {
		return &huma.Response{Description: desc, Content: map[string]*huma.MediaType{"application/json": {Schema: env}}}
	}
	oapi.AddOperation(&huma.Operation{
		OperationID: "uploads.create", Method: http.MethodPost, Path: uploadsPath, Tags: []string{"uploads"},
		Summary: "Upload files",
		Description: fmt.Sprintf("Stores each `file` part content-addressed in the blob store and answers its id (`upl_…`). "+
			"Reference uploads from the build route (form values `tools_upload`, `config_upload`, `code_upload` — the "+
			"upload's filename names the tool) and from collect (`{\"project\": …, \"upload\": \"upl_…\"}` instead of "+
			"`traces`: a collect body, a JSON array of traces, or JSON Lines of traces). Each file is capped at %d bytes "+
			"(413), at most %d files a request; all are stored or none.", ur.MaxFileBytes, ur.MaxFiles),
		Security: WorkspaceKeyAuth(),
		RequestBody: &huma.RequestBody{Required: true, Content: map[string]*huma.MediaType{"multipart/form-data": {
			Schema: &huma.Schema{Type: "object", Properties: map[string]*huma.Schema{
				"file": {Type: "array", Items: &huma.Schema{Type: "string", Format: "binary"}}}, Required: []string{"file"}},
		}}},
		Responses: map[string]*huma.Response{
			"201": {Description: "Stored.", Content: map[string]*huma.MediaType{"application/json": {Schema: ok}}},
			"401": errResp("No or invalid workspace key."),
			"413": errResp("A file, or the number of files, is over its cap."),
			"415": errResp("Not a multipart/form-data body."),
			"422": errResp("A part is malformed, unnamed or unknown; `errors` names it."),
			"503": errResp("The blob store or the database is not answering; nothing was stored."),
		},
		Metadata: map[string]any{MetaVerb: false},
	})
}
