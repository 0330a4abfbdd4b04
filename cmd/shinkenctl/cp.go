package main

// cp: files in and out of a session's workspace (agent/api's
// /v1/sessions/{id}/files), streamed both ways.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// remote splits SESSION:PATH; a local path (one with a slash before any
// colon, or none) is not remote.
func remote(arg string) (session, path string, ok bool) {
	s, p, found := strings.Cut(arg, ":")
	if !found || s == "" || strings.Contains(s, "/") {
		return "", "", false
	}
	return s, p, true
}

// cp SRC SESSION:PATH uploads (SRC - : stdin); cp SESSION:PATH DST
// downloads (DST - : stdout). A PATH ending in / (or a local directory)
// takes the source's file name.
func (c *client) cp(args []string) error {
	usage := fmt.Errorf("usage: cp SRC SESSION:PATH | cp SESSION:PATH DST  (- for stdin or stdout; PATH absolute or relative to the workspace)")
	if len(args) != 2 {
		return usage
	}
	ss, sp, srcRemote := remote(args[0])
	ds, dp, dstRemote := remote(args[1])
	switch {
	case srcRemote == dstRemote:
		return usage
	case dstRemote:
		if strings.HasSuffix(dp, "/") || dp == "" {
			if args[0] == "-" {
				return fmt.Errorf("cp - %s: name the file to write", args[1])
			}
			dp += filepath.Base(args[0])
		}
		return c.upload(args[0], ds, dp)
	}
	return c.download(ss, sp, args[1])
}

func filesURL(session, path string) string {
	return "http://shinken/v1/sessions/" + url.PathEscape(session) + "/files?path=" + url.QueryEscape(path)
}

func (c *client) upload(src, session, path string) error {
	var body io.Reader = os.Stdin
	size := int64(-1)
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("cp %s: not a regular file", src)
		}
		body, size = f, st.Size()
	}
	req, err := http.NewRequest("PUT", filesURL(session, path), io.NopCloser(body))
	if err != nil {
		return err
	}
	req.ContentLength = size // -1: chunked
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := respErr(resp); err != nil {
		return err
	}
	var res struct {
		Path   string `json:"path"`
		Bytes  int64  `json:"bytes"`
		SHA256 string `json:"sha256"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	if c.output == "json" {
		c.printJSON(res)
		return nil
	}
	fmt.Printf("%s:%s  %d bytes  sha256 %s\n", session, res.Path, res.Bytes, res.SHA256)
	return nil
}

func (c *client) download(session, path, dst string) error {
	req, err := http.NewRequest("GET", filesURL(session, path), nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := respErr(resp); err != nil {
		return err
	}
	if dst == "-" {
		n, err := io.Copy(os.Stdout, resp.Body)
		if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
			err = fmt.Errorf("cp: got %d of %d bytes", n, resp.ContentLength)
		}
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, filepath.Base(path))
	}
	// A temporary name beside dst, renamed at the end: a broken transfer
	// leaves dst as it was.
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".part-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("cp: got %d of %d bytes (the file changed or the transfer broke)", n, resp.ContentLength)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(map[string]any{"path": dst, "bytes": n, "sha256": hex.EncodeToString(h.Sum(nil))})
		return nil
	}
	fmt.Printf("%s  %d bytes  sha256 %s\n", dst, n, hex.EncodeToString(h.Sum(nil)))
	return nil
}
