package dynamicinformer

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
)

// source lists and watches a resource's objects as unstructured, namespace by namespace ("" for
// all), for a resource whose namespaces a namespaceSelector picks (see objectsOf): whole
// objects through the dynamic client, or, for a resource whose cache keeps metadata only, their
// metadata through the metadata client (the apiserver sends PartialObjectMetadata, as to
// client-go's metadata informers).
type source interface {
	Namespace(namespace string) lister
}

// objects lists and watches one namespace, or all, for an informer: lists of unstructured or,
// from a jsonSource, of wire objects.
type objects interface {
	List(ctx context.Context, o metav1.ListOptions) (runtime.Object, error)
	Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

// objectsOf is what the informer of r's objects of kind gvk in namespace reads: the objects'
// JSON, whole or, for a resource whose cache keeps metadata only, their metadata (gvk is then
// PartialObjectMetadata's); or, for a resource whose namespaces a namespaceSelector picks
// (whose selectWatch works on unstructured), src's unstructured.
func (r *Resource) objectsOf(gvr schema.GroupVersionResource, gvk schema.GroupVersionKind, src source, namespace string, unstructuredOnly bool) objects {
	if unstructuredOnly {
		return unstructuredObjects{src.Namespace(namespace)}
	}
	l := jsonLister{client: r.m.jsonClient(), gvr: gvr, namespace: namespace,
		read: reader{cuts: cutsOf(r.cfg), typed: typeMembers(gvk.GroupVersion().String(), gvk.Kind), metadataOnly: r.cfg.MetadataOnly()}}
	if l.read.metadataOnly {
		return l // resumes whole objects only (see Resumer)
	}
	for _, s := range r.m.subscribed() {
		if from, ok := s.(Resumer); ok {
			l.resume = &resume{from: from, stream: namespace, selection: selectionOf(r.cfg)}
			break
		}
	}
	return l
}

type unstructuredObjects struct{ lister }

func (o unstructuredObjects) List(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	list, err := o.lister.List(ctx, opts)
	if err != nil {
		return nil, err // not a typed nil
	}
	return list, nil
}

// lister lists and watches one namespace, or all, as unstructured.
type lister interface {
	List(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error)
	Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

// sourceOf is gvr's source: its metadata only when metadataOnly.
func (m *Manager) sourceOf(gvr schema.GroupVersionResource, metadataOnly bool) source {
	if metadataOnly {
		return metadataSource{m.metadata.Resource(gvr)}
	}
	return dynamicSource{m.dynamic.Resource(gvr)}
}

type dynamicSource struct {
	r dynamic.NamespaceableResourceInterface
}

func (s dynamicSource) Namespace(namespace string) lister { return s.r.Namespace(namespace) }

type metadataSource struct{ r metadata.Getter }

func (s metadataSource) Namespace(namespace string) lister {
	return metadataLister{s.r.Namespace(namespace)}
}

type metadataLister struct{ r metadata.ResourceInterface }

func (l metadataLister) List(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	list, err := l.r.List(ctx, o)
	if err != nil {
		return nil, err
	}
	out := &unstructured.UnstructuredList{Object: map[string]any{}, Items: make([]unstructured.Unstructured, len(list.Items))}
	out.SetAPIVersion(metav1.SchemeGroupVersion.String())
	out.SetKind("PartialObjectMetadataList")
	out.SetResourceVersion(list.ResourceVersion)
	out.SetContinue(list.Continue)
	out.SetRemainingItemCount(list.RemainingItemCount)
	for i := range list.Items {
		u, err := partialToUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		out.Items[i] = *u
	}
	return out, nil
}

func (l metadataLister) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	w, err := l.r.Watch(ctx, o)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		if p, ok := e.Object.(*metav1.PartialObjectMetadata); ok {
			u, err := partialToUnstructured(p)
			if err != nil {
				status := metav1.Status{Status: metav1.StatusFailure, Message: err.Error(), Reason: metav1.StatusReasonInternalError, Code: 500}
				return watch.Event{Type: watch.Error, Object: &status}, true
			}
			e.Object = u
		}
		return e, true
	}), nil
}

// partialToUnstructured is p, an object's metadata as the apiserver sends it, as the cache
// keeps it (see object.Object): apiVersion meta.k8s.io/v1, kind PartialObjectMetadata, and metadata.
func partialToUnstructured(p *metav1.PartialObjectMetadata) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		return nil, fmt.Errorf("convert the metadata of %s/%s: %w", p.Namespace, p.Name, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(metav1.SchemeGroupVersion.String())
	u.SetKind("PartialObjectMetadata")
	return u, nil
}
