package config

import (
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// Emptier is a CEL map or list that says whether it is empty without counting its members: the
// objects' JSON a filter reads lazily (see delivery's jsonMap and jsonList).
type Emptier interface {
	IsEmpty() bool
}

// standardTrackers are CEL's standard cost model's charges at run time, by overload.
var standardTrackers = cost.StandardOverloadTrackers()

// equalityCosts charges == and != what CEL's standard cost model charges them at run time,
// without counting the members of an Emptier where its count cannot change the charge. The
// model charges the smaller operand's size (a tenth of it, rounded up, and at least 1): when
// the other operand's size is 0 or 1 (null, a bool, a number, an empty or one-character string,
// an empty or one-member literal), the smaller size is that one, or 0 when the Emptier is
// empty, so the standard charge is asked for with a string standing in for the Emptier: "" when
// it is empty, else "x". `oldObject == null` counted the old object's top-level members,
// reading it whole to skip its spec and status: a third of a filter's time on a pod of 4 KB.
// Every other call is left to the standard model (nil).
type equalityCosts struct{}

func (equalityCosts) CallCost(_, overload string, args []ref.Val, result ref.Val) *uint64 {
	if overload != overloads.Equals && overload != overloads.NotEquals || len(args) != 2 {
		return nil
	}
	lazy := -1
	for i, a := range args {
		if _, ok := a.(Emptier); ok {
			if lazy >= 0 {
				return nil // both sizes matter
			}
			lazy = i
		}
	}
	if lazy < 0 {
		return nil
	}
	other := args[1-lazy]
	if _, opt := other.(*types.Optional); opt || types.IsUnknownOrError(other) || cost.ActualSize(other) > 1 {
		return nil
	}
	track, ok := standardTrackers[overload]
	if !ok {
		return nil
	}
	stand := types.String("x")
	if args[lazy].(Emptier).IsEmpty() {
		stand = ""
	}
	var sized [2]ref.Val
	sized[lazy], sized[1-lazy] = stand, other
	return track(sized[:], result)
}
