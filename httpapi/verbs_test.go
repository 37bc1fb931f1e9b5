package httpapi

import (
	"net/http"
	"net/url"
	"strconv"
	"testing"

	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// booleanValues are the spellings a client may send for a boolean query parameter.
var booleanValues = []string{"", "1", "0", "true", "True", "TRUE", "false", "False", "FALSE", "t", "f", "yes", "no", "on", "off"}

// apiserverListOptions decodes v as the apiserver's list and watch handlers do.
func apiserverListOptions(t *testing.T, v url.Values) metainternalversion.ListOptions {
	t.Helper()
	var opts metainternalversion.ListOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(v, metav1.SchemeGroupVersion, &opts); err != nil {
		t.Fatalf("the apiserver's parameter codec refused %v: %v", v, err)
	}
	return opts
}

func TestBooleanParametersReadAsTheAPIServerReadsThem(t *testing.T) {
	for _, s := range booleanValues {
		t.Run("value "+strconv.Quote(s), func(t *testing.T) {
			v := url.Values{"sendInitialEvents": {s}, "allowWatchBookmarks": {s}}
			want := apiserverListOptions(t, v)
			q, serr := parseQuery(v, 500)
			if serr != nil {
				t.Fatalf("parseQuery(%v) = %v; the apiserver accepts it", v, serr)
			}
			if q.allowWatchBookmarks != want.AllowWatchBookmarks {
				t.Errorf("allowWatchBookmarks=%q read as %v; the apiserver reads %v", s, q.allowWatchBookmarks, want.AllowWatchBookmarks)
			}
			if q.sendInitialEvents != *want.SendInitialEvents {
				t.Errorf("sendInitialEvents=%q read as %v; the apiserver reads %v", s, q.sendInitialEvents, *want.SendInitialEvents)
			}
		})
	}
}

// TestAGetIsServedAsTheVerbItIsAuthorizedAs checks that every GET is served as the verb the
// apiserver's RequestInfoFactory authorizes it as: a collection with any watch value other
// than 0 or false is a watch, and a path that names an object is a get, whatever its watch.
func TestAGetIsServedAsTheVerbItIsAuthorizedAs(t *testing.T) {
	infoFactory := request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	for _, path := range []string{"/api/v1/namespaces/a/configmaps", "/api/v1/namespaces/a/configmaps/public", "/api/v1/nodes", "/api/v1/nodes/n1"} {
		for _, s := range booleanValues {
			u := path + "?watch=" + url.QueryEscape(s)
			r, err := http.NewRequest(http.MethodGet, u, nil)
			if err != nil {
				t.Fatal(err)
			}
			info, err := infoFactory.NewRequestInfo(r)
			if err != nil {
				t.Fatal(err)
			}
			tg, ok := parsePath(path)
			if !ok {
				t.Fatalf("parsePath(%q) failed", path)
			}
			if got := routeOf(r, tg); got != info.Verb {
				t.Errorf("GET %s is served as %s; the apiserver authorizes it as %s", u, got, info.Verb)
			}
		}
	}
}

// TestSelectorsReachTheAuthorizer checks that a list's or watch's label and field selectors
// are in the attributes the SubjectAccessReview is made of, as the apiserver's
// AuthorizeWithSelectors passes them to its authorizers.
func TestSelectorsReachTheAuthorizer(t *testing.T) {
	infoFactory := request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	r, err := http.NewRequest(http.MethodGet, "/api/v1/namespaces/a/configmaps?watch=1&labelSelector=app%3Dweb,tier+in+(a,b)&fieldSelector=metadata.name!%3Dx", nil)
	if err != nil {
		t.Fatal(err)
	}
	info, err := infoFactory.NewRequestInfo(r)
	if err != nil {
		t.Fatal(err)
	}
	attrs := attributes(&authenticator.Response{User: &user.DefaultInfo{Name: "alice"}}, info)
	labels, lerr := attrs.GetLabelSelector()
	fields, ferr := attrs.GetFieldSelector()
	if lerr != nil || ferr != nil {
		t.Fatalf("selectors did not parse: %v, %v", lerr, ferr)
	}
	if len(labels) != 2 || labels[0].String() != "app=web" || labels[1].String() != "tier in (a,b)" {
		t.Errorf("label selector requirements %v; want app=web and tier in (a,b)", labels)
	}
	if len(fields) != 1 || fields[0].Field != "metadata.name" || fields[0].Value != "x" || fields[0].Operator != "!=" {
		t.Errorf("field selector requirements %+v; want metadata.name!=x", fields)
	}
}
