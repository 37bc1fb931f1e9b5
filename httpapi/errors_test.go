package httpapi

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// TestAPanicAnswersNothingInternal: a handler that panics answers 500 with a Status that names
// nothing of the panic; the log has it.
func TestAPanicAnswersNothingInternal(t *testing.T) {
	var log strings.Builder
	r := gin.New()
	r.Use(recovery(slog.New(slog.NewTextHandler(&log, nil))))
	r.GET("/", func(*gin.Context) { panic("index 7 of configmaps-by-owner is corrupt") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "configmaps-by-owner") {
		t.Errorf("a panic answered %d %s; want 500 naming nothing internal", w.Code, w.Body)
	}
	if !strings.Contains(log.String(), "configmaps-by-owner") {
		t.Errorf("the log does not have the panic: %s", log.String())
	}
}

// TestALoggedURLIsCut: a path or query string is logged at most loggedLength bytes long,
// however long the request's.
func TestALoggedURLIsCut(t *testing.T) {
	long := strings.Repeat("labelSelector=a%3Db&", 50_000) // 1 MB
	if got := truncated(long); len(got) > loggedLength+32 || !strings.HasSuffix(got, "(1000000 bytes)") {
		t.Errorf("a 1 MB query string is logged as %d bytes ending %q", len(got), got[max(0, len(got)-20):])
	}
	if got := truncated("watch=1"); got != "watch=1" {
		t.Errorf("a short query string is logged as %q", got)
	}
}
