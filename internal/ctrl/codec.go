package ctrl

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos/internal/fault"
)

// Request decoding failures happen inside connect-go, before any
// interceptor, so their errors would carry no ErrorDetail. The codecs below
// therefore never fail a decode: they leave the message empty and stash the
// error in an unknown field with a reserved number, and decodeInterceptor
// turns it into an invalid_argument fault with a detail.
//
// The JSON codec is strict: unknown fields are refused (connect-go's default
// discards them), so a misspelled field is an error instead of silently
// ignored input.

// decodeErrorField is the unknown-field number that carries a decode error
// from the codec to the interceptor (the largest legal field number, never
// used by the API).
const decodeErrorField protowire.Number = protowire.MaxValidNumber

type deferringCodec struct {
	name      string
	marshal   func(proto.Message) ([]byte, error)
	unmarshal func([]byte, proto.Message) error
}

func (c deferringCodec) Name() string { return c.name }

func (c deferringCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a proto.Message", v)
	}
	return c.marshal(m)
}

func (c deferringCodec) Unmarshal(b []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a proto.Message", v)
	}
	if err := c.unmarshal(b, m); err != nil {
		proto.Reset(m)
		var raw []byte
		raw = protowire.AppendTag(raw, decodeErrorField, protowire.BytesType)
		raw = protowire.AppendString(raw, err.Error())
		m.ProtoReflect().SetUnknown(raw)
	}
	return nil
}

func codecs() []connect.HandlerOption {
	bin := deferringCodec{
		name:      "proto",
		marshal:   proto.Marshal,
		unmarshal: func(b []byte, m proto.Message) error { return proto.Unmarshal(b, m) },
	}
	jsonCodec := func(name string) deferringCodec {
		return deferringCodec{
			name:      name,
			marshal:   func(m proto.Message) ([]byte, error) { return protojson.Marshal(m) },
			unmarshal: func(b []byte, m proto.Message) error { return protojson.Unmarshal(b, m) },
		}
	}
	return []connect.HandlerOption{
		connect.WithCodec(bin),
		connect.WithCodec(jsonCodec("json")),
		connect.WithCodec(jsonCodec("json; charset=utf-8")),
	}
}

// decodeError returns the decode error a deferringCodec stashed in msg.
func decodeError(msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	raw := m.ProtoReflect().GetUnknown()
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return nil
		}
		raw = raw[n:]
		if num == decodeErrorField && typ == protowire.BytesType {
			s, n := protowire.ConsumeString(raw)
			if n < 0 {
				return errors.New("malformed request")
			}
			return errors.New(s)
		}
		n = protowire.ConsumeFieldValue(num, typ, raw)
		if n < 0 {
			return nil
		}
		raw = raw[n:]
	}
	return nil
}

// decodeInterceptor refuses requests whose body did not decode.
func decodeInterceptor() connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if err := decodeError(req.Any()); err != nil {
				return nil, fault.Invalid("", "request body does not decode: %v", err)
			}
			return next(ctx, req)
		}
	}
}
