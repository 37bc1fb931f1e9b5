package journal

import (
	"slices"
	"strconv"
	"time"

	"github.com/dynwatch/dynwatch/object"
)

// Entry is one event recorded for one sink: what the sink is to be sent, and where its outbox
// entry is.
type Entry struct {
	// Event is what happened. An entry read back from the outbox (Journal.ReadOutbox) carries
	// only its object's name, namespace, uid and resourceVersion, and Body is the whole
	// request, unless the cache still holds that version of the object: then it carries the
	// cache's object, and no Body (see Options.Current).
	Event object.Event
	// ID identifies the event for idempotency: the same on every redelivery, after a restart,
	// and on every replica (see EventID).
	ID string
	// Key orders a sink's entries: those with the same key (the same object by resource,
	// namespace and name, whatever its uid) are delivered one at a time, in order (see
	// object.OrderingKey).
	Key      string
	Enqueued time.Time
	// Body is the request body, or nil to build it from Event and Old (see AppendBody): an
	// entry as recorded is queued so, and the body is made where it is sent rather than held
	// while it waits.
	Body []byte
	// Old, when not nil, is the old object's JSON that a body built from Event carries as its
	// oldObject (the stored state, as the sinks last saw it); nil takes Event's OldObject.
	Old []byte
	// Seq numbers the outbox entry; 0 when there is none (no state store).
	Seq uint64
	// Deadline ends retrying; zero until the first attempt fails, then kept across reloads and
	// restarts.
	Deadline time.Time
	// Revision is the event's: a checkpoint at or past it acknowledges the entry.
	Revision uint64
	// Since is the event's (see object.Event.Since), 0 when Revision is exact: while
	// the entry is in the outbox, this replica's checkpoints stay below it.
	Since uint64
	// FilterError is why the sink's filter could not decide on the event (an evaluation error,
	// its cost limit); empty when it selected the event. The sink acts on it as its
	// filterErrors says: a dead letter, or a delivery flagged with it.
	FilterError string
}

// EventID is the event's idempotency key: its object's uid and resourceVersion and its type,
// and for an object that came in or went out with its namespace (Event.Moved) the selection's
// revision at which it did, so that a namespace leaving and coming back brings its objects
// back under ids of their own, which a receiver deduplicating by id does not drop. It is the
// same on every redelivery, on a replay of the same change after a restart, and on every
// replica that records the change.
func EventID(e object.Event) string {
	id := string(e.Object.GetUID()) + "." + e.Object.GetResourceVersion() + "." + e.Type.Lower()
	if e.Moved {
		id += "." + strconv.FormatUint(e.Revision, 10)
	}
	return id
}

// AppendBody appends d's request body to buf: Body, or when that is nil the payload of its
// event, {"type","resource":{"group","version","resource"},"managers","object","oldObject"} (managers
// only when the event names them), with Old as
// its oldObject when not nil. It is the body the entry was recorded with, byte for byte.
func AppendBody(buf []byte, d Entry) []byte {
	if d.Body != nil {
		return append(buf, d.Body...)
	}
	return appendPayload(slices.Grow(buf, payloadSize(d.Event, d.Old)), d.Event, d.Old)
}

// payloadSize is the length of e's request body, give or take its framing.
func payloadSize(e object.Event, oldJSON []byte) int {
	n := len(e.Object.JSON()) + len(e.Managers) + 256
	if oldJSON != nil {
		n += len(oldJSON)
	} else if e.OldObject != nil {
		n += len(e.OldObject.JSON())
	}
	return n
}

// appendPayload appends e's request body to buf: the objects' JSON as kept, or for the old
// object oldJSON when it is not nil.
func appendPayload(buf []byte, e object.Event, oldJSON []byte) []byte {
	b := payloadOf(e, oldJSON)
	buf = appendPayloadHead(buf, e)
	buf = append(buf, b.object...)
	if b.old != nil {
		buf = append(buf, oldObjectField...)
		buf = append(buf, b.old...)
	}
	return append(buf, '}')
}

// payload is a request body in pieces: head, its beginning through the object's field name
// (appendPayloadHead), the object's JSON, and the old object's (nil without one) after
// oldObjectField; a closing brace ends it. A commit writes the objects from where they lie.
type payload struct{ head, object, old []byte }

const oldObjectField = `,"oldObject":`

// payloadOf is e's body without its head (see appendPayload).
func payloadOf(e object.Event, oldJSON []byte) payload {
	b := payload{object: e.Object.JSON()}
	if e.OldObject != nil {
		b.old = oldJSON
		if b.old == nil {
			b.old = e.OldObject.JSON()
		}
	}
	return b
}

// len is the body's length.
func (b payload) len() int {
	n := len(b.head) + len(b.object) + 1
	if b.old != nil {
		n += len(oldObjectField) + len(b.old)
	}
	return n
}

// appendPayloadHead appends the beginning of e's body, through the object's field name.
func appendPayloadHead(buf []byte, e object.Event) []byte {
	buf = append(buf, `{"type":`...)
	buf = object.AppendString(buf, string(e.Type))
	buf = append(buf, `,"resource":{"group":`...)
	buf = object.AppendString(buf, e.Resource.Group)
	buf = append(buf, `,"version":`...)
	buf = object.AppendString(buf, e.Resource.Version)
	buf = append(buf, `,"resource":`...)
	buf = object.AppendString(buf, e.Resource.Resource)
	if e.Managers != nil {
		buf = append(buf, `},"managers":`...)
		buf = append(buf, e.Managers...)
		return append(buf, `,"object":`...)
	}
	return append(buf, `},"object":`...)
}
