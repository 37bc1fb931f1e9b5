package validate

import (
	"encoding/json"
	"fmt"
	"os"
)

// Record is what one run recorded: the reference history, and every stream, list and sink
// recorded against it. A run that fails writes its record (Write), so that it can be validated
// again (cmd/validate) as the run did, and its seed replayed.
type Record struct {
	// Seed and Fault name the run: what chose its writes and its fault.
	Seed  uint64 `json:",omitempty"`
	Fault string `json:",omitempty"`

	History History
	Streams []Stream `json:",omitempty"`
	Lists   []List   `json:",omitempty"`
	Sinks   []Sink   `json:",omitempty"`
}

// Violations runs every validator over the record: Watch over each stream, Paged over each
// list, Deliveries and Delivered over each sink.
func (r Record) Violations() []Violation {
	var out []Violation
	for _, s := range r.Streams {
		out = append(out, Watch(r.History, s)...)
	}
	for _, l := range r.Lists {
		out = append(out, Paged(r.History, l)...)
	}
	for _, s := range r.Sinks {
		out = append(out, Deliveries(r.History, s)...)
		out = append(out, Delivered(r.History, s)...)
	}
	return out
}

// Write writes the record to path as JSON.
func (r Record) Write(path string) error {
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// ReadRecord reads a record Write wrote.
func ReadRecord(path string) (Record, error) {
	var r Record
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
