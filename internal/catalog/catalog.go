// Package catalog implements the operations shared by caller-owned endpoint
// objects, Egresses and Resolvers: create, get, list, update with CAS,
// delete guarded by references, and label and annotation updates. Each
// operation is a command (internal/command) and each rule is stated once
// here; the API handlers only convert messages.
package catalog

import (
	"context"
	"errors"
	"maps"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/labels"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
)

// ObjectType describes one type of catalog object: its spec S and its
// rules.
type ObjectType[S proto.Message] struct {
	// ResourceKind is the kind of its rows in the store (and the
	// ObjectKind of its commands).
	ResourceKind store.ResourceKind
	// Noun names the type in messages ("egress").
	Noun string
	// IDPrefix starts every ID ("eg-").
	IDPrefix string
	// IDField is the request field that names an object ("egress_id").
	IDField string
	// NewSpec allocates an empty spec.
	NewSpec func() S
	// Validate checks a spec's syntax.
	Validate func(field string, s S) error
	// Check runs the slow checks (endpoint resolution) before admission.
	Check func(ctx context.Context, field string, s S) error
	// GuardUpdate refuses a spec change that a reference depends on.
	GuardUpdate func(ctx context.Context, tx store.Tx, id string, old, new S) error
	// AfterUpdate, when set, runs in the transaction of an Update that
	// changed the spec (a new revision), after the row r was written: the
	// referencing Workspaces' generations move there (reconciler.Repush).
	AfterUpdate func(ctx context.Context, tx store.Tx, id string, r *store.Resource) error
	// DeleteRefs are the reference kinds that block a delete.
	DeleteRefs []store.RefKind
}

// Object is a decoded catalog object.
type Object[S proto.Message] struct {
	*store.Resource
	Spec S
}

// Service runs the operations of one object type.
type Service[S proto.Message] struct {
	Type   ObjectType[S]
	Engine *command.Engine
	Store  store.Store
	Pages  *paging.Codec
	Now    func() time.Time
}

func (s *Service[S]) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

func (s *Service[S]) decode(r *store.Resource) (*Object[S], error) {
	spec := s.Type.NewSpec()
	if err := proto.Unmarshal(r.Spec, spec); err != nil {
		return nil, fault.Internal("decode %s spec: %v", s.Type.Noun, err)
	}
	return &Object[S]{Resource: r, Spec: spec}, nil
}

func (s *Service[S]) load(ctx context.Context, tx store.Tx, id string) (*store.Resource, error) {
	r, err := tx.GetResource(ctx, s.Type.ResourceKind, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound(s.Type.Noun, id)
	}
	return r, err
}

func (s *Service[S]) validateID(id string) error {
	return ids.Validate(s.Type.IDField, s.Type.IDPrefix, s.Type.Noun, id)
}

// Respond converts an object to the method's response.
type Respond[S proto.Message, Resp proto.Message] func(*Object[S]) Resp

// Create stores a new object at revision 1.
func Create[S proto.Message, Req command.Input, Resp proto.Message](ctx context.Context, s *Service[S], method string, req Req,
	spec S, lbls, annotations map[string]string, respond Respond[S, Resp], newResp func() Resp) (Resp, error) {
	var zero Resp
	if err := s.Type.Validate("spec", spec); err != nil {
		return zero, err
	}
	if err := labels.ValidateLabels("labels", lbls); err != nil {
		return zero, err
	}
	if err := labels.ValidateAnnotations("annotations", annotations); err != nil {
		return zero, err
	}
	return command.Execute(ctx, s.Engine, command.Spec[Req, Resp]{
		Method: method, ObjectKind: string(s.Type.ResourceKind), Request: req, NewResponse: newResp,
		Prepare: func(ctx context.Context) error { return s.Type.Check(ctx, "spec", spec) },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (Resp, error) {
			b, err := marshal(spec)
			if err != nil {
				return zero, err
			}
			now := s.now()
			r := &store.Resource{
				Kind: s.Type.ResourceKind, ID: ids.New(s.Type.IDPrefix), CreatedAt: now, UpdatedAt: now,
				Revision: 1, Spec: b,
				Labels: nonNil(lbls), LabelsRevision: 1,
				Annotations: nonNil(annotations), AnnotationsRevision: 1,
			}
			if err := tx.InsertResource(ctx, r); err != nil {
				return zero, err
			}
			rec.ObjectID = r.ID
			o, err := s.decode(r)
			if err != nil {
				return zero, err
			}
			return respond(o), nil
		},
	})
}

// Get reads one object.
func (s *Service[S]) Get(ctx context.Context, id string) (*Object[S], error) {
	if err := s.validateID(id); err != nil {
		return nil, err
	}
	var r *store.Resource
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		r, err = s.load(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.decode(r)
}

// List returns one page of objects in creation order, and the token of the
// next page ("" on the last).
func (s *Service[S]) List(ctx context.Context, pageSize uint32, token string, selector map[string]string) ([]*Object[S], string, error) {
	rows, next, err := ListPage(ctx, s.Store, s.Pages, s.Type.ResourceKind, pageSize, token, selector)
	if err != nil {
		return nil, "", err
	}
	out := make([]*Object[S], 0, len(rows))
	for _, r := range rows {
		o, err := s.decode(r)
		if err != nil {
			return nil, "", err
		}
		out = append(out, o)
	}
	return out, next, nil
}

// ListPage returns one page of the stored resources of kind that carry
// every selector entry as a label, in creation order, and the token of the
// next page ("" on the last). It applies the listing rules: page_size
// limits, selector syntax, page tokens bound to kind and selector.
func ListPage(ctx context.Context, st store.Store, pages *paging.Codec, kind store.ResourceKind, pageSize uint32, token string, selector map[string]string) ([]*store.Resource, string, error) {
	n, err := paging.PageSize("page_size", pageSize)
	if err != nil {
		return nil, "", err
	}
	if err := labels.ValidateSelector("label_selector", selector); err != nil {
		return nil, "", err
	}
	filter := paging.Filter(labels.Canonical(selector))
	cur, ok, err := pages.Decode(string(kind), filter, token)
	if err != nil {
		return nil, "", err
	}
	q := store.ListQuery{Kind: kind, Selector: selector, Limit: n + 1}
	if ok {
		q.After = &store.Cursor{CreatedAt: cur.CreatedAt, ID: cur.ID}
	}
	var rows []*store.Resource
	err = st.View(ctx, func(tx store.Tx) error {
		var err error
		rows, err = tx.ListResources(ctx, q)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(rows) > n {
		rows = rows[:n]
		last := rows[n-1]
		next = pages.Encode(string(kind), filter, paging.Cursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	return rows, next, nil
}

// Update replaces an object's spec under CAS on its revision. Equal content
// keeps the revision (and drainSeconds is then not used). A new revision is
// stored with drainSeconds (store.Resource.DrainSeconds: for Egresses, how
// long connections through the previous revision keep running) and then
// runs ObjectType.AfterUpdate in the same transaction.
func Update[S proto.Message, Req command.Input, Resp proto.Message](ctx context.Context, s *Service[S], method string, req Req,
	id string, expected uint64, spec S, drainSeconds uint32, same func(a, b S) bool, respond Respond[S, Resp], newResp func() Resp) (Resp, error) {
	var zero Resp
	if err := s.validateID(id); err != nil {
		return zero, err
	}
	if expected == 0 {
		return zero, fault.Invalid("expected_revision", "expected_revision is required")
	}
	if err := s.Type.Validate("spec", spec); err != nil {
		return zero, err
	}
	return command.Execute(ctx, s.Engine, command.Spec[Req, Resp]{
		Method: method, ObjectKind: string(s.Type.ResourceKind), ObjectID: id, Request: req, NewResponse: newResp,
		Prepare: func(ctx context.Context) error { return s.Type.Check(ctx, "spec", spec) },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (Resp, error) {
			r, err := s.load(ctx, tx, id)
			if err != nil {
				return zero, err
			}
			if r.Revision != expected {
				return zero, fault.RevisionMismatch("expected_revision", expected, r.Revision)
			}
			cur, err := s.decode(r)
			if err != nil {
				return zero, err
			}
			if same(cur.Spec, spec) {
				return respond(cur), nil
			}
			if s.Type.GuardUpdate != nil {
				if err := s.Type.GuardUpdate(ctx, tx, id, cur.Spec, spec); err != nil {
					return zero, err
				}
			}
			b, err := marshal(spec)
			if err != nil {
				return zero, err
			}
			r.Spec = b
			r.Revision++
			r.DrainSeconds = drainSeconds
			r.UpdatedAt = s.now()
			if err := tx.UpdateResource(ctx, r); err != nil {
				return zero, err
			}
			if s.Type.AfterUpdate != nil {
				if err := s.Type.AfterUpdate(ctx, tx, id, r); err != nil {
					return zero, err
				}
			}
			o, err := s.decode(r)
			if err != nil {
				return zero, err
			}
			return respond(o), nil
		},
	})
}

// Delete removes an object that no policy of a non-deleted Workspace
// references.
func Delete[S proto.Message, Req command.Input, Resp proto.Message](ctx context.Context, s *Service[S], method string, req Req,
	id string, resp func() Resp) (Resp, error) {
	var zero Resp
	if err := s.validateID(id); err != nil {
		return zero, err
	}
	return command.Execute(ctx, s.Engine, command.Spec[Req, Resp]{
		Method: method, ObjectKind: string(s.Type.ResourceKind), ObjectID: id, Request: req, NewResponse: resp,
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (Resp, error) {
			if _, err := s.load(ctx, tx, id); err != nil {
				return zero, err
			}
			for _, k := range s.Type.DeleteRefs {
				n, err := tx.CountReferences(ctx, k, id)
				if err != nil {
					return zero, err
				}
				if n > 0 {
					return zero, fault.Precondition(fault.ReasonConflict,
						"%s %q is referenced by the network policy of %d non-deleted workspace(s)", s.Type.Noun, id, n)
				}
			}
			if err := tx.DeleteResource(ctx, s.Type.ResourceKind, id); err != nil {
				return zero, err
			}
			return resp(), nil
		},
	})
}

// MapField selects the labels or the annotations of an object.
type MapField int

// The two maps of an object.
const (
	Labels MapField = iota
	Annotations
)

// UpdateMap replaces the labels or annotations of an object as a whole,
// under CAS on their own revision. Equal content keeps the revision.
func UpdateMap[S proto.Message, Req command.Input, Resp proto.Message](ctx context.Context, s *Service[S], method string, req Req,
	id string, which MapField, expected uint64, m map[string]string, respond Respond[S, Resp], newResp func() Resp) (Resp, error) {
	var zero Resp
	if err := s.validateID(id); err != nil {
		return zero, err
	}
	field := "labels"
	validate := labels.ValidateLabels
	if which == Annotations {
		field, validate = "annotations", labels.ValidateAnnotations
	}
	if err := validate(field, m); err != nil {
		return zero, err
	}
	return command.Execute(ctx, s.Engine, command.Spec[Req, Resp]{
		Method: method, ObjectKind: string(s.Type.ResourceKind), ObjectID: id, Request: req, NewResponse: newResp,
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (Resp, error) {
			r, err := s.load(ctx, tx, id)
			if err != nil {
				return zero, err
			}
			cur, rev := &r.Labels, &r.LabelsRevision
			if which == Annotations {
				cur, rev = &r.Annotations, &r.AnnotationsRevision
			}
			if *rev != expected {
				return zero, fault.RevisionMismatch("expected_revision", expected, *rev)
			}
			if !maps.Equal(*cur, m) {
				*cur = nonNil(m)
				*rev++
				r.UpdatedAt = s.now()
				if err := tx.UpdateResource(ctx, r); err != nil {
					return zero, err
				}
			}
			o, err := s.decode(r)
			if err != nil {
				return zero, err
			}
			return respond(o), nil
		},
	})
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

func marshal(m proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fault.Internal("encode spec: %v", err)
	}
	return b, nil
}
