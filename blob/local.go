package blob

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Local is a Store on a local directory. Its errors name keys, never the directory or its files. Each object is one file holding a small header (size, key, content type)
// followed by the bytes, named by the SHA-256 of its key, so no key can name a path outside the directory.
// Writes are atomic and durable: temp file, fsync, rename, fsync of the directory.
type Local struct {
	root string
}

var _ Store = (*Local)(nil)

// localMagic starts every object file; the digit is the format version.
const localMagic = "DPLBLOB1"

// maxHeaderLen bounds the JSON header so a corrupt file cannot make Get allocate much.
const maxHeaderLen = 64 << 10

type localHeader struct {
	Key         string `json:"key"`
	ContentType string `json:"contentType"`
}

// NewLocal returns a Local store rooted at dir, creating the directory if needed.
func NewLocal(dir string) (*Local, error) {
	if dir == "" {
		return nil, errors.New("blob: local store dir is empty")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("blob: local store dir %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("blob: create local store dir: %w", err)
	}
	return &Local{root: abs}, nil
}

// Dir returns the store's root directory.
func (l *Local) Dir() string { return l.root }

func (l *Local) path(key string) (dir, file string) {
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:])
	dir = filepath.Join(l.root, h[:2])
	return dir, filepath.Join(dir, h)
}

// Put implements Store.
func (l *Local) Put(ctx context.Context, key string, r io.Reader, size int64, contentType string) (err error) {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if size < -1 {
		return fmt.Errorf("blob: put %q: size %d is negative (use -1 for unknown)", key, size)
	}
	if contentType == "" {
		contentType = DefaultContentType
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, final := l.path(key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()

	var src io.Reader = ctxReader{ctx: ctx, r: r}
	if size >= 0 {
		src = newExactReader(ctx, r, size)
	}
	if _, err := writeHeader(f, localHeader{Key: key, ContentType: contentType}, max(size, 0)); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	bw := bufio.NewWriterSize(f, 256<<10)
	n, err := io.Copy(bw, src)
	if err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	if size < 0 {
		// The size was unknown when the header was written: fill it in now.
		if _, err := f.WriteAt(binary.BigEndian.AppendUint64(nil, uint64(n)), sizeOffset); err != nil {
			return fmt.Errorf("blob: put %q: %w", key, noPath(err))
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("blob: put %q: fsync: %w", key, noPath(err))
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, noPath(err))
	}
	return nil
}

// The file layout: magic, data size (uint64 big-endian), header length (uint32 big-endian), JSON header, data.
// The size sits at a fixed offset so a Put of unknown size can fill it in after copying.
const sizeOffset = int64(len(localMagic))

func writeHeader(w io.Writer, h localHeader, size int64) (int64, error) {
	js, err := json.Marshal(h)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 0, len(localMagic)+12+len(js))
	buf = append(buf, localMagic...)
	buf = binary.BigEndian.AppendUint64(buf, uint64(size))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(js)))
	buf = append(buf, js...)
	n, err := w.Write(buf)
	return int64(n), err
}

func readHeader(f *os.File) (localHeader, int64, int64, error) {
	var pre [len(localMagic) + 12]byte
	if _, err := io.ReadFull(f, pre[:]); err != nil {
		return localHeader{}, 0, 0, fmt.Errorf("read header: %w", err)
	}
	if string(pre[:len(localMagic)]) != localMagic {
		return localHeader{}, 0, 0, errors.New("not a blob file (bad magic)")
	}
	size := int64(binary.BigEndian.Uint64(pre[sizeOffset:]))
	n := binary.BigEndian.Uint32(pre[sizeOffset+8:])
	if n > maxHeaderLen || size < 0 {
		return localHeader{}, 0, 0, fmt.Errorf("corrupt header (size %d, header length %d)", size, n)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(f, js); err != nil {
		return localHeader{}, 0, 0, fmt.Errorf("read header: %w", err)
	}
	var h localHeader
	if err := json.Unmarshal(js, &h); err != nil {
		return localHeader{}, 0, 0, fmt.Errorf("decode header: %w", err)
	}
	return h, size, int64(len(pre)) + int64(n), nil
}

// open opens key's file and checks its header; the caller closes the file.
func (l *Local) open(key string) (*os.File, localHeader, int64, int64, error) {
	if err := ValidateKey(key); err != nil {
		return nil, localHeader{}, 0, 0, err
	}
	_, p := l.path(key)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, localHeader{}, 0, 0, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if err != nil {
		return nil, localHeader{}, 0, 0, fmt.Errorf("blob: open %q: %w", key, noPath(err))
	}
	h, size, off, err := readHeader(f)
	if err == nil && h.Key != key {
		err = fmt.Errorf("file holds key %q", h.Key)
	}
	if err == nil {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil && fi.Size() != off+size {
			err = fmt.Errorf("file is %d bytes, header says %d", fi.Size(), off+size)
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, localHeader{}, 0, 0, fmt.Errorf("blob: open %q: %w", key, noPath(err))
	}
	return f, h, size, off, nil
}

type localReader struct {
	*io.SectionReader
	f *os.File
}

func (r localReader) Close() error { return r.f.Close() }

// Get implements Store. The returned reader also implements io.ReaderAt and io.Seeker.
func (l *Local) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, _, size, off, err := l.open(key)
	if err != nil {
		return nil, err
	}
	return localReader{SectionReader: io.NewSectionReader(f, off, size), f: f}, nil
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, key string) (Info, error) {
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	f, h, size, _, err := l.open(key)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Info{}, fmt.Errorf("blob: stat %q: %w", key, noPath(err))
	}
	return Info{Key: key, Size: size, ContentType: h.ContentType, ModTime: fi.ModTime()}, nil
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, p := l.path(key)
	err := os.Remove(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("blob: delete %q: %w", key, noPath(err))
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("blob: delete %q: %w", key, noPath(err))
	}
	return nil
}

// Ping implements Store: the directory exists and a file can be created in it.
func (l *Local) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.CreateTemp(l.root, ".ping-*")
	if err != nil {
		return fmt.Errorf("blob: local store not writable: %w", noPath(err))
	}
	name := f.Name()
	_ = f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("blob: local store: %w", noPath(err))
	}
	return nil
}

// noPath drops the file path an os error names: the store's errors name keys and say what failed, never where
// the store keeps its files (they reach build errors and the unauthenticated /readyz).
func noPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("fsync dir: %w", err)
	}
	return d.Close()
}
