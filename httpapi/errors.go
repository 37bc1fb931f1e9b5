package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// writeStatus answers with a metav1.Status, as the apiserver does for errors.
func writeStatus(w http.ResponseWriter, err *apierrors.StatusError) {
	st := statusOf(err)
	writeJSON(w, int(st.Code), &st)
}

// statusOf is err's Status as the apiserver sends it, with its kind and apiVersion.
func statusOf(err *apierrors.StatusError) metav1.Status {
	st := err.ErrStatus
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	return st
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// badParameter is a 400 whose message names the query parameter.
func badParameter(param, format string, args ...any) *apierrors.StatusError {
	return apierrors.NewBadRequest(param + ": " + fmt.Sprintf(format, args...))
}

// notServed is the apiserver's 404 for a path that names no served resource.
func notServed() *apierrors.StatusError {
	return apierrors.NewGenericServerResponse(http.StatusNotFound, "get", schema.GroupResource{}, "", "the server could not find the requested resource", 0, false)
}
