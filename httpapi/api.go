package httpapi

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// Cache is what the API reads: the informer manager.
type Cache interface {
	Readiness
	Status() []dynamicinformer.Status
}

// StatusResponse is the body of GET /status.
type StatusResponse struct {
	Ready     bool                     `json:"ready"`
	NotReady  []string                 `json:"notReady,omitempty"`
	Resources []dynamicinformer.Status `json:"resources"`
}

// NewAPI returns the API handler.
func NewAPI(log *slog.Logger, cache Cache) http.Handler {
	r := gin.New()
	r.Use(recovery(log), requestLog(log))
	r.GET("/status", func(c *gin.Context) {
		ok, reasons := cache.Ready()
		c.JSON(http.StatusOK, StatusResponse{Ready: ok, NotReady: reasons, Resources: cache.Status()})
	})
	return r
}

func recovery(log *slog.Logger) gin.HandlerFunc {
	return gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, err any) {
		log.Error("panic serving request", "method", c.Request.Method, "path", c.Request.URL.Path, "err", err)
		c.AbortWithStatus(http.StatusInternalServerError)
	})
}

func requestLog(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		log.Debug("request", "method", c.Request.Method, "path", c.Request.URL.Path,
			"status", c.Writer.Status(), "duration", time.Since(start), "remote", c.ClientIP())
	}
}
