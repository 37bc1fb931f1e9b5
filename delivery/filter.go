package delivery

import (
	"fmt"
	"slices"
	"unsafe"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types/ref"
	"github.com/tidwall/gjson"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// Selects implements journal.Target: it reports whether the sink's filters select e. An event
// its filter cannot decide on is counted, logged (at most a line a second, naming the object,
// never its content) and, as filterErrors says, selected with the error (deadLetter, deliver)
// or left out (drop).
func (s *Sink) Selects(e object.Event) (bool, error) {
	c := s.cfg()
	if len(c.EventTypes) > 0 && !slices.Contains(c.EventTypes, string(e.Type)) {
		return false, nil
	}
	if len(c.GroupResources) > 0 && !slices.Contains(c.GroupResources, e.Resource.GroupResource()) {
		return false, nil
	}
	if len(c.Namespaces) > 0 && !slices.Contains(c.Namespaces, e.Object.GetNamespace()) {
		return false, nil
	}
	if !c.Labels.Empty() && !c.Labels.Matches(e.Object.Labels()) &&
		(e.OldObject == nil || !c.Labels.Matches(e.OldObject.Labels())) {
		return false, nil
	}
	if c.Subject != nil && !s.mayBeAllowed(c.Subject, e) {
		return false, nil
	}
	if c.Program == nil {
		return true, nil
	}
	ok, err := evaluate(c.Program, e)
	if err == nil {
		return ok, nil
	}
	s.m.filterErrors.Inc()
	s.filterLog.Do(func() {
		s.log.Warn("the filter could not decide on an event", "resource", object.ResourceName(e.Resource), "namespace", e.Object.GetNamespace(),
			"name", e.Object.GetName(), "type", string(e.Type), "filterErrors", string(c.FilterErrors), "err", err)
	})
	return c.FilterErrors != config.FilterErrorsDrop, fmt.Errorf("filter: %w", err)
}

// mayBeAllowed reports whether subject may watch e's object, or whether that is not known yet:
// it never waits on a review, which would hold up every sink's events. An event whose decision
// is not known is selected, and its sink decides before it is sent (authorize).
func (s *Sink) mayBeAllowed(subject *config.Subject, e object.Event) bool {
	if s.access == nil {
		return false
	}
	allowed, known := s.access.Known(subject, e.Resource, e.Object.GetNamespace())
	return allowed || !known
}

// evaluate runs a filter on e, its objects read lazily from the JSON the cache keeps (see
// lazyjson.go): only what the expression names is decoded.
func evaluate(p cel.Program, e object.Event) (bool, error) {
	vars := map[string]any{
		"type":      string(e.Type),
		"object":    newJSONMap(parse(e.Object.JSON())),
		"oldObject": nil,
		"resource":  map[string]string{"group": e.Resource.Group, "version": e.Resource.Version, "resource": e.Resource.Resource},
	}
	if e.OldObject != nil {
		vars["oldObject"] = newJSONMap(parse(e.OldObject.JSON()))
	}
	return decision(p.Eval(vars))
}

// decision is what a filter's result decides: its bool, or an error.
func decision(out ref.Val, _ *cel.EvalDetails, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	ok, isBool := out.Value().(bool)
	if !isBool {
		return false, fmt.Errorf("the filter returned %s, not a bool", out.Type().TypeName())
	}
	return ok, nil
}

// parse is the JSON b, read in place: a cached object's JSON is never written again, and
// nothing the filter makes of it outlives the evaluation but its bool.
func parse(b []byte) gjson.Result { return gjson.Parse(unsafe.String(unsafe.SliceData(b), len(b))) }
