package api

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

// TestWriteJSONArraySameBytes: the streamed list is byte for byte what
// writeJSON writes for the same slice (empty, one element, several, with
// characters JSON escapes), with the same status and content type.
func TestWriteJSONArraySameBytes(t *testing.T) {
	uid := uint32(1879048193)
	views := []SessionView{
		{SessionSpec: agent.SessionSpec{ID: "a", Image: "py"}, Index: 1, CgroupID: 77, Path: "/sys/fs/cgroup/shinken/a", UID: &uid},
		{SessionSpec: agent.SessionSpec{ID: "b<&>\"\\", Image: "go", Expires: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}, Index: 2},
		{SessionSpec: agent.SessionSpec{ID: "c"}, Paused: true},
	}
	for _, n := range []int{0, 1, 3} {
		want := httptest.NewRecorder()
		writeJSON(want, 200, views[:n:n])
		got := httptest.NewRecorder()
		writeJSONArray(got, 200, n, func(i int) any { return views[i] })
		if got.Code != want.Code || got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
			t.Fatalf("%d elements: status %d %q, want %d %q", n, got.Code, got.Header().Get("Content-Type"), want.Code, want.Header().Get("Content-Type"))
		}
		if got.Body.String() != want.Body.String() {
			t.Fatalf("%d elements:\n%s\nwant\n%s", n, got.Body, want.Body)
		}
	}
}
