package object

import (
	"strings"
	"testing"
)

// benchManagedFields is managedFields as the bench's configmaps carry them through the storm:
// two appliers and the updates' manager.
var benchManagedFields = []byte("[" + strings.Join([]string{
	entry("deployer", "Apply", t0, `{"f:data":{"f:config.json":{},"f:settings.ini":{}},"f:metadata":{"f:annotations":{"f:example.com/team":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{"f:app":{},"f:app.kubernetes.io/name":{},"f:tier":{}}}}`),
	entry("operator", "Apply", t0, `{"f:data":{"f:operator-note":{}}}`),
	entry("bench", "Update", t1, `{"f:data":{"f:counter":{}}}`),
}, ",") + "]")

func BenchmarkManagersOf(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		ManagersOf(benchManagedFields)
	}
}
