package object

// Cluster names the cluster a change happened in (see config.Cluster): what every event
// dynwatch sends, every dead letter, /status and the query API's answers carry.
type Cluster struct {
	// ID identifies the cluster; never empty once dynwatch runs.
	ID string `json:"id"`
	// Name is a display name; empty: none.
	Name string `json:"name,omitempty"`
	// From says where ID came from: ClusterIDConfigured, ClusterIDFromClusterProperty or
	// ClusterIDFromKubeSystem.
	From string `json:"from"`
	// InKeys puts ID in every JetStream subject and Kafka record key (config.Cluster.InKeys).
	InKeys bool `json:"inKeys"`
}

// Where a Cluster's ID came from.
const (
	ClusterIDConfigured          = "cluster.id"
	ClusterIDFromClusterProperty = "ClusterProperty"
	ClusterIDFromKubeSystem      = "kube-system"
)
