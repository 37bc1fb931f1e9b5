package delivery

import (
	"fmt"
	"slices"
	"unsafe"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
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
	return decision(p.Eval(&eventActivation{e: e}))
}

// eventActivation is a filter's variables for one event, each made when the expression first
// reads it: a map of them, and of the resource's names, made for every evaluation was more
// than a third of what filtering allocated.
type eventActivation struct {
	e                 object.Event
	object, oldObject any
}

func (a *eventActivation) ResolveName(name string) (any, bool) {
	switch name {
	case "type":
		return string(a.e.Type), true
	case "object":
		if a.object == nil {
			a.object = newJSONMap(parse(a.e.Object.JSON()))
		}
		return a.object, true
	case "oldObject":
		if a.e.OldObject == nil {
			return nil, true
		}
		if a.oldObject == nil {
			a.oldObject = newJSONMap(parse(a.e.OldObject.JSON()))
		}
		return a.oldObject, true
	case "resource":
		return map[string]string{"group": a.e.Resource.Group, "version": a.e.Resource.Version, "resource": a.e.Resource.Resource}, true
	}
	return nil, false
}

func (a *eventActivation) Parent() interpreter.Activation { return nil }

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
