package main

// The API client: one HTTP call over the Unix socket (errors decoded from the
// API's error body), and the JSON and table printers every verb uses.

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

type client struct {
	hc     *http.Client
	output string
}

// apiError is a non-2xx answer.
type apiError struct {
	Status int
	Msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Status) }

func (c *client) call(method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://shinken"+path, rd)
	if err != nil {
		return 0, err
	}
	if u := os.Getenv("SUDO_USER"); u != "" {
		req.Header.Set("X-Shinken-Actor", u)
	} else if u := os.Getenv("USER"); u != "" {
		req.Header.Set("X-Shinken-Actor", u)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) {
			return 0, fmt.Errorf("cannot reach the agent: %w (is shinken-agent running, and are you root or in the operator group?)", ne.Err)
		}
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	// /v1/requests answers each request in the body, whatever the status.
	if path == "/v1/requests" && out != nil && json.Unmarshal(data, out) == nil {
		return resp.StatusCode, nil
	}
	// A refused policy change (409) carries its report in the body.
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusAccepted && !(resp.StatusCode == http.StatusConflict && path == "/v1/policies") {
		return resp.StatusCode, apiErrorOf(resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode answer: %w", err)
		}
	}
	return resp.StatusCode, nil
}

// apiErrorOf is a refused answer as an apiError: the body's wire.Error, or
// the body itself.
func apiErrorOf(status int, data []byte) error {
	var e wire.Error
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return &apiError{status, e.Error}
	}
	return &apiError{status, strings.TrimSpace(string(data))}
}

// respErr is a non-2xx answer as an apiError (nil for a 2xx one); it reads
// at most 64 KiB of the body.
func respErr(resp *http.Response) error {
	if resp.StatusCode < 300 {
		return nil
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return apiErrorOf(resp.StatusCode, data)
}

// positionals parses args with fs, flags allowed between the positional
// arguments (shinkenctl logs SESSION -f PROCESS), and returns those.
func positionals(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	return pos, nil
}

func (c *client) printJSON(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func table(header string, rows [][]string) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

func need(args []string, n int, what string) error {
	if len(args) < n {
		return fmt.Errorf("usage: %s", what)
	}
	return nil
}
