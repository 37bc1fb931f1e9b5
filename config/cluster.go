package config

import (
	"fmt"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Cluster names the cluster dynwatch watches, in every event it sends (the CloudEvents
// extension attributes cluster and clustername), every dead letter, /status and the query
// API's answers, so that the events of several clusters can share one receiver, stream or
// topic.
type Cluster struct {
	// ID identifies the cluster. Empty: the ClusterProperty cluster.clusterset.k8s.io (KEP-2149)
	// where the apiserver serves that API and dynwatch may read it, else the kube-system
	// namespace's uid, read once at start.
	ID string `mapstructure:"id"`
	// Name is a display name for people, sent beside the id (clustername); empty: none.
	Name string `mapstructure:"name"`
	// InKeys puts the cluster's id in every JetStream subject, after the prefix, and at the
	// start of every Kafka record key, so that two clusters' events of objects with the same
	// name are ordered apart. false keeps the layout of earlier releases, which names the
	// object only (see docs/identity.md for the migration).
	InKeys *bool `mapstructure:"inKeys"`
}

// MaxClusterIDLength bounds cluster.id, as KEP-2149 bounds cluster.clusterset.k8s.io.
const MaxClusterIDLength = 128

// ValidateClusterID returns what is wrong with id as a cluster's id, or nil: an RFC 1123
// subdomain of at most 128 characters, which every kind of sink carries as it is (a uid is one).
func ValidateClusterID(id string) error {
	if len(id) > MaxClusterIDLength {
		return fmt.Errorf("must be at most %d characters, got %d", MaxClusterIDLength, len(id))
	}
	if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 {
		return fmt.Errorf("%q: %s", id, strings.Join(errs, "; "))
	}
	return nil
}

func (c Cluster) validate(p *problems) {
	if c.ID != "" {
		if err := ValidateClusterID(c.ID); err != nil {
			p.add("cluster.id", "%v", err)
		}
	}
	if len(c.Name) > 253 {
		p.add("cluster.name", "must be at most 253 characters, got %d", len(c.Name))
	}
	if strings.ContainsFunc(c.Name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		p.add("cluster.name", "must be printable characters, got %q", c.Name)
	}
}
