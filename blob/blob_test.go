package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/blob/blobtest"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key  string
		ok   bool
		want string // substring of the error
	}{
		{"traces/ws_1/batch-0001.jsonl", true, ""},
		{"bundles/sha256/" + strings.Repeat("a", 64), true, ""},
		{"a", true, ""},
		{"x=1+y:z@w", true, ""},
		{"", false, "empty"},
		{"/abs", false, "empty segment"},
		{"a/", false, "empty segment"},
		{"a//b", false, "empty segment"},
		{"..", false, "dot"},
		{"a/../b", false, "dot"},
		{".env", false, "dot"},
		{"a\\b", false, "character"},
		{"a b", false, "character"},
		{"a\nb", false, "character"},
		{"é", false, "character"},
		{strings.Repeat("k", blob.MaxSegmentLen), true, ""},
		{strings.Repeat("k", blob.MaxSegmentLen+1), false, "segment of 256 bytes"},
		{strings.Repeat("k/", blob.MaxKeyLen/2) + "k", false, "longer than"},
	}
	for _, tc := range tests {
		err := blob.ValidateKey(tc.key)
		if tc.ok {
			if err != nil {
				t.Errorf("ValidateKey(%q) = %v, want nil", tc.key, err)
			}
			continue
		}
		if !errors.Is(err, blob.ErrInvalidKey) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey mentioning %q", tc.key, err, tc.want)
		}
	}
}

func TestContentKey(t *testing.T) {
	data := []byte("hello")
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	tests := []struct{ prefix, want string }{
		{"bundles", "bundles/" + h},
		{"bundles/", "bundles/" + h},
		{"a/b", "a/b/" + h},
		{"", h},
	}
	for _, tc := range tests {
		if got := blob.ContentKey(tc.prefix, data); got != tc.want {
			t.Errorf("ContentKey(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
		if err := blob.ValidateKey(blob.ContentKey(tc.prefix, data)); err != nil {
			t.Errorf("ContentKey(%q) is not a valid key: %v", tc.prefix, err)
		}
	}
	if blob.ContentKey("p", []byte("hellp")) == blob.ContentKey("p", data) {
		t.Errorf("different data gave the same content key")
	}
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		url     string
		want    blob.S3Options
		wantErr string
	}{
		{url: "http://minio:minio123@127.0.0.1:9000/doppel",
			want: blob.S3Options{Endpoint: "127.0.0.1:9000", AccessKey: "minio", SecretKey: "minio123", Bucket: "doppel"}},
		{url: "https://AK:S%2Fk%40y@s3.example.com/bkt/?region=eu-west-1",
			want: blob.S3Options{Endpoint: "s3.example.com", AccessKey: "AK", SecretKey: "S/k@y", Bucket: "bkt", Region: "eu-west-1", UseSSL: true}},
		{url: "ftp://a:b@h:1/b", wantErr: "scheme"},
		{url: "http://h:1/bucket", wantErr: "credentials"},
		{url: "http://a@h:1/bucket", wantErr: "secret key"},
		{url: "http://:sec@h:1/bucket", wantErr: "access key"},
		{url: "http://a:sec@h:1", wantErr: "bucket"},
		{url: "http://a:sec@h:1/b1/extra", wantErr: "single bucket"},
		{url: "http://a:sec@h:1/Bad_Bucket", wantErr: "bucket"},
		{url: "http://a:sec@h:1/bkt?foo=1", wantErr: "foo"},
		{url: "http://a:sec@/bkt", wantErr: "host"},
		{url: "::not a url sec", wantErr: "parse"},
	}
	for _, tc := range tests {
		got, err := blob.ParseURL(tc.url)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseURL(%q) error = %v, want one mentioning %q", tc.url, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "sec@") {
				t.Errorf("ParseURL(%q) error leaks the secret: %v", tc.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseURL(%q): %v", tc.url, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseURL(%q) = %+v, want %+v", tc.url, got, tc.want)
		}
	}
}

func TestS3OptionsValidate(t *testing.T) {
	good := blob.S3Options{Endpoint: "h:9000", AccessKey: "a", SecretKey: "s", Bucket: "bkt"}
	tests := []struct {
		name   string
		mutate func(*blob.S3Options)
		want   string
	}{
		{"endpoint", func(o *blob.S3Options) { o.Endpoint = "" }, "endpoint"},
		{"endpoint scheme", func(o *blob.S3Options) { o.Endpoint = "http://h:9000" }, "endpoint"},
		{"access key", func(o *blob.S3Options) { o.AccessKey = "" }, "access key"},
		{"secret key", func(o *blob.S3Options) { o.SecretKey = "" }, "secret key"},
		{"bucket", func(o *blob.S3Options) { o.Bucket = "" }, "bucket"},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	for _, tc := range tests {
		o := good
		tc.mutate(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want error mentioning %q", tc.name, err, tc.want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := blob.NewS3(ctx, o); err == nil {
			t.Errorf("%s: NewS3 accepted invalid options", tc.name)
		}
		cancel()
	}
}

func TestLocalContract(t *testing.T) {
	s, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	blobtest.Contract(t, s)
	// Failed and successful Puts alike leave no temp files behind.
	err = filepath.WalkDir(s.Dir(), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".tmp-") || strings.HasPrefix(d.Name(), ".ping-") {
			t.Errorf("leftover temp file %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestS3Contract(t *testing.T) {
	blobtest.Contract(t, blobtest.NewS3(t))
}

func TestNewS3CreatesBucketAndPing(t *testing.T) {
	s := blobtest.NewS3(t) // a fresh bucket name, created by NewS3
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping on created bucket: %v", err)
	}
	// A second NewS3 on the existing bucket succeeds and sees the same objects.
	opts, err := blob.ParseURL(os.Getenv("DOPPEL_TEST_S3"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Bucket = s.Bucket()
	if err := s.Put(ctx, "k", bytes.NewReader([]byte("v")), 1, ""); err != nil {
		t.Fatal(err)
	}
	s2, err := blob.NewS3(ctx, opts)
	if err != nil {
		t.Fatalf("NewS3 on existing bucket: %v", err)
	}
	if info, err := s2.Stat(ctx, "k"); err != nil || info.Size != 1 {
		t.Fatalf("second client Stat = %+v, %v", info, err)
	}
	// Wrong credentials fail Ping-equivalent construction with an error, not a hang.
	bad := opts
	bad.SecretKey = "wrong-secret"
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := blob.NewS3(cctx, bad); err == nil {
		t.Fatalf("NewS3 with a wrong secret succeeded")
	}
}

func TestLocalRejectsCorruptFiles(t *testing.T) {
	dir := t.TempDir()
	s, err := blob.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := []byte("some bytes")
	if err := s.Put(ctx, "k", bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
	var file string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			file = p
		}
		return nil
	})
	if file == "" {
		t.Fatal("no object file written")
	}
	// Objects live under the root, named by hash, never by the key itself.
	if strings.Contains(file, "/k") && filepath.Base(file) == "k" {
		t.Fatalf("object file named after its key: %s", file)
	}
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		content []byte
	}{
		{"truncated", orig[:len(orig)-3]},
		{"bad magic", append([]byte("XXXXXXXX"), orig[8:]...)},
		{"extra bytes", append(append([]byte{}, orig...), 'x')},
		{"empty", nil},
	}
	for _, tc := range tests {
		if err := os.WriteFile(file, tc.content, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stat(ctx, "k"); err == nil {
			t.Errorf("%s file: Stat succeeded", tc.name)
		}
		if rc, err := s.Get(ctx, "k"); err == nil {
			rc.Close()
			t.Errorf("%s file: Get succeeded", tc.name)
		}
	}
}

func TestNewLocalErrors(t *testing.T) {
	if _, err := blob.NewLocal(""); err == nil {
		t.Errorf("NewLocal(\"\") succeeded")
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := blob.NewLocal(f); err == nil {
		t.Errorf("NewLocal on a regular file succeeded")
	}
}
