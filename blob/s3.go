package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// S3Options locate an S3-compatible bucket (MinIO, AWS S3, ...).
type S3Options struct {
	Endpoint  string // host:port, no scheme
	AccessKey string
	SecretKey string
	Bucket    string
	Region    string // empty: let the client discover it
	UseSSL    bool
}

// Validate reports the first missing or malformed field by name.
func (o S3Options) Validate() error {
	switch {
	case o.Endpoint == "":
		return errors.New("blob: S3 endpoint is empty")
	case strings.Contains(o.Endpoint, "://") || strings.Contains(o.Endpoint, "/"):
		return fmt.Errorf("blob: S3 endpoint %q must be host:port without scheme or path", o.Endpoint)
	case o.AccessKey == "":
		return errors.New("blob: S3 access key is empty")
	case o.SecretKey == "":
		return errors.New("blob: S3 secret key is empty")
	}
	if err := s3utils.CheckValidBucketNameStrict(o.Bucket); err != nil {
		return fmt.Errorf("blob: S3 bucket %q: %w", o.Bucket, err)
	}
	return nil
}

// ParseURL reads S3 options from a URL of the form http(s)://ACCESS_KEY:SECRET_KEY@host:port/bucket[?region=R]
// (the DOPPEL_TEST_S3 form). https sets UseSSL. Errors never contain the secret.
func ParseURL(raw string) (S3Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse errors quote the input, which holds the secret.
		return S3Options{}, errors.New("blob: S3 URL does not parse as a URL")
	}
	red := u.Redacted()
	var o S3Options
	switch u.Scheme {
	case "http":
	case "https":
		o.UseSSL = true
	default:
		return S3Options{}, fmt.Errorf("blob: S3 URL %s: scheme must be http or https", red)
	}
	o.Endpoint = u.Host
	if o.Endpoint == "" {
		return S3Options{}, fmt.Errorf("blob: S3 URL %s: host is missing", red)
	}
	if u.User == nil {
		return S3Options{}, fmt.Errorf("blob: S3 URL %s: credentials (ACCESS_KEY:SECRET_KEY@) are missing", red)
	}
	o.AccessKey = u.User.Username()
	o.SecretKey, _ = u.User.Password()
	if o.AccessKey == "" {
		return S3Options{}, fmt.Errorf("blob: S3 URL %s: access key is missing", red)
	}
	if o.SecretKey == "" {
		return S3Options{}, fmt.Errorf("blob: S3 URL %s: secret key is missing", red)
	}
	o.Bucket = strings.Trim(u.Path, "/")
	if o.Bucket == "" {
		return S3Options{}, fmt.Errorf("blob: S3 URL %s: bucket (the path) is missing", red)
	}
	if strings.Contains(o.Bucket, "/") {
		return S3Options{}, fmt.Errorf("blob: S3 URL %s: path must be a single bucket name", red)
	}
	q := u.Query()
	for k := range q {
		if k != "region" {
			return S3Options{}, fmt.Errorf("blob: S3 URL %s: unknown query parameter %q (only region)", red, k)
		}
	}
	o.Region = q.Get("region")
	if err := o.Validate(); err != nil {
		return S3Options{}, err
	}
	return o, nil
}

// S3 is a Store on an S3-compatible bucket through minio-go.
type S3 struct {
	client *minio.Client
	bucket string
}

var _ Store = (*S3)(nil)

// s3PartSize bounds the memory a Put of unknown size buffers per part.
const s3PartSize = 16 << 20

// NewS3 connects to the bucket, creating it if it does not exist.
func NewS3(ctx context.Context, o S3Options) (*S3, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c, err := minio.New(o.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(o.AccessKey, o.SecretKey, ""),
		Secure: o.UseSSL,
		Region: o.Region,
	})
	if err != nil {
		return nil, fmt.Errorf("blob: S3 client for %s: %w", o.Endpoint, err)
	}
	ok, err := c.BucketExists(ctx, o.Bucket)
	if err != nil {
		return nil, fmt.Errorf("blob: S3 %s bucket %q: %w", o.Endpoint, o.Bucket, err)
	}
	if !ok {
		err := c.MakeBucket(ctx, o.Bucket, minio.MakeBucketOptions{Region: o.Region})
		if err != nil && minio.ToErrorResponse(err).Code != minio.BucketAlreadyOwnedByYou {
			return nil, fmt.Errorf("blob: S3 %s create bucket %q: %w", o.Endpoint, o.Bucket, err)
		}
	}
	return &S3{client: c, bucket: o.Bucket}, nil
}

// Bucket returns the bucket name.
func (s *S3) Bucket() string { return s.bucket }

// Client returns the underlying minio-go client (for tests and admin tasks such as removing a bucket).
func (s *S3) Client() *minio.Client { return s.client }

// Put implements Store. A single PUT (objects under 16 MiB) or a completed multipart upload is atomic on S3.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64, contentType string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if size < -1 {
		return fmt.Errorf("blob: put %q: size %d is negative (use -1 for unknown)", key, size)
	}
	if contentType == "" {
		contentType = DefaultContentType
	}
	opts := minio.PutObjectOptions{ContentType: contentType}
	var src io.Reader = ctxReader{ctx: ctx, r: r}
	switch {
	case size == 0:
		// The client sends no body for size 0 and so never reads r: check here that r is empty.
		ex := newExactReader(ctx, r, 0)
		if err := ex.checkEnd(); err != nil {
			return fmt.Errorf("blob: put %q: %w", key, err)
		}
		src = ex
	case size > 0:
		src = newExactReader(ctx, r, size)
	default:
		opts.PartSize = s3PartSize
	}
	if _, err := s.client.PutObject(ctx, s.bucket, key, src, size, opts); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, err)
	}
	return nil
}

func (s *S3) notFound(err error, key string) error {
	switch minio.ToErrorResponse(err).Code {
	case minio.NoSuchKey:
		return fmt.Errorf("%w: %q", ErrNotFound, key)
	case minio.NoSuchBucket:
		return fmt.Errorf("%w: %q (bucket %q is missing)", ErrNotFound, key, s.bucket)
	}
	return nil
}

// Get implements Store.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	// One plain GET whose body is streamed: a missing key fails here, and the body is one version of the object
	// even if it is overwritten meanwhile (minio.Object would issue further conditional requests, which fail
	// mid-read on an overwrite).
	body, _, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		if nf := s.notFound(err, key); nf != nil {
			return nil, nf
		}
		return nil, fmt.Errorf("blob: get %q: %w", key, err)
	}
	return body, nil
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, err
	}
	oi, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		if nf := s.notFound(err, key); nf != nil {
			return Info{}, nf
		}
		return Info{}, fmt.Errorf("blob: stat %q: %w", key, err)
	}
	return Info{Key: key, Size: oi.Size, ContentType: oi.ContentType, ModTime: oi.LastModified}, nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("blob: delete %q: %w", key, err)
	}
	return nil
}

// Ping implements Store: the bucket exists and the credentials work.
func (s *S3) Ping(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return fmt.Errorf("blob: S3 ping: %w", err)
	}
	if !ok {
		return fmt.Errorf("blob: S3 ping: bucket %q does not exist", s.bucket)
	}
	return nil
}
