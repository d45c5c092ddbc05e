// Package blobtest holds the blob.Store contract tests, a real-MinIO store for tests, and a PUT latency meter.
package blobtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/internal/testenv"
)

// NewS3 returns a store on a fresh bucket of the real MinIO/S3 named by DOPPEL_TEST_S3 (skipping, or failing
// under DOPPEL_TEST_REQUIRE=1, when unset). The bucket and its objects are removed when the test ends.
func NewS3(t testing.TB) *blob.S3 {
	t.Helper()
	opts, err := blob.ParseURL(testenv.S3(t))
	if err != nil {
		t.Fatalf("DOPPEL_TEST_S3: %v", err)
	}
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		t.Fatal(err)
	}
	opts.Bucket = "t-" + hex.EncodeToString(suffix[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := blob.NewS3(ctx, opts)
	if err != nil {
		t.Fatalf("blob.NewS3: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := removeBucket(ctx, s.Client(), s.Bucket()); err != nil {
			t.Errorf("remove test bucket %s: %v", s.Bucket(), err)
		}
	})
	return s
}

func removeBucket(ctx context.Context, c *minio.Client, bucket string) error {
	for obj := range c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			return obj.Err
		}
		if err := c.RemoveObject(ctx, bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
			return err
		}
	}
	// ForceDelete (a MinIO extension) also drops leftovers such as aborted multipart uploads.
	return c.RemoveBucketWithOptions(ctx, bucket, minio.RemoveBucketOptions{ForceDelete: true})
}

// payload returns n deterministic bytes that differ by seed.
func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func get(t *testing.T, s blob.Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%q) read: %v", key, err)
	}
	return b
}

func put(t *testing.T, s blob.Store, key string, data []byte, ct string) {
	t.Helper()
	if err := s.Put(context.Background(), key, bytes.NewReader(data), int64(len(data)), ct); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func wantNotFound(t *testing.T, s blob.Store, key string) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Stat(ctx, key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat(%q) error = %v, want ErrNotFound", key, err)
	}
	if rc, err := s.Get(ctx, key); !errors.Is(err, blob.ErrNotFound) {
		if rc != nil {
			rc.Close()
		}
		t.Fatalf("Get(%q) error = %v, want ErrNotFound", key, err)
	}
}

// failingReader yields data, then fails with err.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// Contract runs the behaviour every blob.Store must have against s. s should be empty and private to the test.
func Contract(t *testing.T, s blob.Store) {
	ctx := context.Background()

	t.Run("Ping", func(t *testing.T) {
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	})

	t.Run("RoundTrip", func(t *testing.T) {
		tests := []struct {
			name, key, ct, wantCT string
			size                  int
		}{
			{"small json", "traces/ws1/batch-1.jsonl", "application/x-ndjson", "application/x-ndjson", 100},
			{"empty object", "empty", "text/plain", "text/plain", 0},
			{"default content type", "bundles/x.tar", "", blob.DefaultContentType, 4096},
			{"multi-chunk", "big/obj", "application/octet-stream", "application/octet-stream", 3<<20 + 17},
			{"odd but legal chars", "a/b=c+d:e@f_g-h.i", "text/plain", "text/plain", 10},
		}
		for i, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				data := payload(tc.size, byte(i))
				put(t, s, tc.key, data, tc.ct)
				if got := get(t, s, tc.key); !bytes.Equal(got, data) {
					t.Fatalf("Get returned %d bytes, want the %d bytes put (equal=%v)", len(got), len(data), bytes.Equal(got, data))
				}
				info, err := s.Stat(ctx, tc.key)
				if err != nil {
					t.Fatalf("Stat: %v", err)
				}
				if info.Key != tc.key || info.Size != int64(tc.size) || info.ContentType != tc.wantCT {
					t.Fatalf("Stat = %+v, want key %q size %d content type %q", info, tc.key, tc.size, tc.wantCT)
				}
				if info.ModTime.IsZero() {
					t.Fatalf("Stat ModTime is zero")
				}
			})
		}
	})

	t.Run("UnknownSize", func(t *testing.T) {
		data := payload(1<<20+3, 42)
		// io.MultiReader hides the length, as a network body would.
		if err := s.Put(ctx, "unknown/size", io.MultiReader(bytes.NewReader(data)), -1, "application/octet-stream"); err != nil {
			t.Fatalf("Put size -1: %v", err)
		}
		if got := get(t, s, "unknown/size"); !bytes.Equal(got, data) {
			t.Fatalf("Get after unknown-size Put: %d bytes, want %d", len(got), len(data))
		}
		info, err := s.Stat(ctx, "unknown/size")
		if err != nil || info.Size != int64(len(data)) {
			t.Fatalf("Stat = %+v, %v; want size %d", info, err, len(data))
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		wantNotFound(t, s, "never/written")
	})

	t.Run("Overwrite", func(t *testing.T) {
		put(t, s, "ow", []byte("first version"), "text/plain")
		put(t, s, "ow", []byte("second"), "application/json")
		if got := string(get(t, s, "ow")); got != "second" {
			t.Fatalf("after overwrite Get = %q, want %q", got, "second")
		}
		if info, err := s.Stat(ctx, "ow"); err != nil || info.Size != 6 || info.ContentType != "application/json" {
			t.Fatalf("after overwrite Stat = %+v, %v", info, err)
		}
	})

	t.Run("ParentAndChildKeys", func(t *testing.T) {
		put(t, s, "nest", []byte("parent"), "")
		put(t, s, "nest/child", []byte("child"), "")
		if got := string(get(t, s, "nest")); got != "parent" {
			t.Fatalf("Get(nest) = %q", got)
		}
		if got := string(get(t, s, "nest/child")); got != "child" {
			t.Fatalf("Get(nest/child) = %q", got)
		}
	})

	t.Run("Delete", func(t *testing.T) {
		put(t, s, "del/me", []byte("x"), "")
		if err := s.Delete(ctx, "del/me"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		wantNotFound(t, s, "del/me")
		if err := s.Delete(ctx, "del/me"); err != nil {
			t.Fatalf("Delete of a missing key = %v, want nil", err)
		}
	})

	t.Run("InvalidKeys", func(t *testing.T) {
		keys := []string{"", "/abs", "trailing/", "a//b", "../escape", "a/../../b", "./x", "a/./b", ".hidden",
			"back\\slash", "sp ace", "nul\x00", "ünicode", strings.Repeat("k", blob.MaxSegmentLen+1),
			strings.Repeat("k/", blob.MaxKeyLen/2) + "k"}
		for _, key := range keys {
			if err := s.Put(ctx, key, strings.NewReader("x"), 1, ""); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Put(%q) error = %v, want ErrInvalidKey", key, err)
			}
			if _, err := s.Get(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Get(%q) error = %v, want ErrInvalidKey", key, err)
			}
			if _, err := s.Stat(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Stat(%q) error = %v, want ErrInvalidKey", key, err)
			}
			if err := s.Delete(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Delete(%q) error = %v, want ErrInvalidKey", key, err)
			}
		}
		// Keys at the limits are fine.
		put(t, s, strings.Repeat("s", blob.MaxSegmentLen), []byte("long segment"), "")
		long := strings.Repeat(strings.Repeat("k", 254)+"/", 4)
		long += strings.Repeat("k", blob.MaxKeyLen-len(long))
		put(t, s, long, []byte("long key"), "")
	})

	t.Run("SizeMismatchStoresNothing", func(t *testing.T) {
		put(t, s, "mm/existing", []byte("keep me"), "text/plain")
		data := payload(200<<10, 7)
		cases := []struct {
			name string
			r    func() io.Reader
			size int64
		}{
			{"short", func() io.Reader { return bytes.NewReader(data[:1000]) }, int64(len(data))},
			{"long", func() io.Reader { return bytes.NewReader(data) }, 1000},
			{"long by one", func() io.Reader { return bytes.NewReader(data[:1001]) }, 1000},
			{"empty declared, data given", func() io.Reader { return bytes.NewReader(data[:1]) }, 0},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := s.Put(ctx, "mm/existing", tc.r(), tc.size, "application/json")
				if err == nil {
					t.Fatalf("Put with wrong size succeeded")
				}
				if !errors.Is(err, blob.ErrSizeMismatch) {
					t.Fatalf("Put with wrong size error = %v, want it to wrap ErrSizeMismatch", err)
				}
				if got := string(get(t, s, "mm/existing")); got != "keep me" {
					t.Fatalf("failed Put changed the object: %q", got)
				}
				if err := s.Put(ctx, "mm/fresh", tc.r(), tc.size, ""); err == nil {
					t.Fatalf("Put with wrong size to a new key succeeded")
				}
				wantNotFound(t, s, "mm/fresh")
			})
		}
		if err := s.Put(ctx, "mm/negative", strings.NewReader("x"), -2, ""); err == nil {
			t.Fatalf("Put with size -2 succeeded")
		}
	})

	t.Run("ReaderErrorStoresNothing", func(t *testing.T) {
		boom := errors.New("boom")
		r := &failingReader{data: payload(64<<10, 3), err: boom}
		err := s.Put(ctx, "rerr", r, -1, "")
		if !errors.Is(err, boom) {
			t.Fatalf("Put with failing reader error = %v, want it to wrap %v", err, boom)
		}
		wantNotFound(t, s, "rerr")
	})

	t.Run("CanceledContext", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := s.Put(cctx, "canceled", strings.NewReader("x"), 1, ""); !errors.Is(err, context.Canceled) {
			t.Fatalf("Put with canceled context error = %v, want context.Canceled", err)
		}
		wantNotFound(t, s, "canceled")
	})

	t.Run("ReadersSeeWholeObjects", func(t *testing.T) {
		// One writer alternates two versions while readers Get; every read must be exactly one version.
		a, b := payload(256<<10, 1), payload(256<<10+1, 2)
		put(t, s, "atomic", a, "")
		errs := make(chan error, 3)
		stop := make(chan struct{})
		writerDone := make(chan int)
		go func() {
			i := 0
			defer func() { writerDone <- i }()
			for ; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := a
				if i%2 == 0 {
					v = b
				}
				if err := s.Put(ctx, "atomic", bytes.NewReader(v), int64(len(v)), ""); err != nil {
					errs <- fmt.Errorf("Put during reads: %w", err)
					return
				}
			}
		}()
		var readers sync.WaitGroup
		for range 2 {
			readers.Add(1)
			go func() {
				defer readers.Done()
				for range 30 {
					rc, err := s.Get(ctx, "atomic")
					if err != nil {
						errs <- fmt.Errorf("Get during overwrite: %w", err)
						return
					}
					got, err := io.ReadAll(rc)
					rc.Close()
					if err != nil {
						errs <- fmt.Errorf("read during overwrite: %w", err)
						return
					}
					if !bytes.Equal(got, a) && !bytes.Equal(got, b) {
						errs <- fmt.Errorf("read %d bytes that are neither version", len(got))
						return
					}
				}
			}()
		}
		readers.Wait()
		close(stop)
		writes := <-writerDone
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if writes < 2 {
			t.Logf("only %d overwrites happened during the reads", writes)
		}
	})
}
