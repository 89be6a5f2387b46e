package bus

import (
	"context"
	"errors"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// EnsureStream returns the stream of cfg: created when missing, updated
// only when a setting execmesh makes differs from what the server holds.
// Every process of a deployment ensures the same streams at start, often
// at once; an update that changes nothing is not free (it rewrites the
// store's configuration, and raced consumer creation inside nats-server
// 2.15's file store under the race detector).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, cfg.Name) // another process made it
		}
	}
	if err != nil {
		return nil, err
	}
	if streamSettingsMatch(s.CachedInfo().Config, cfg) {
		return s, nil
	}
	return js.UpdateStream(ctx, cfg)
}

// streamSettingsMatch reports whether have carries every setting of want
// that execmesh sets (the server fills in the others).
func streamSettingsMatch(have, want jetstream.StreamConfig) bool {
	return slices.Equal(have.Subjects, want.Subjects) &&
		have.Description == want.Description &&
		have.Storage == want.Storage &&
		have.Retention == want.Retention &&
		have.Discard == want.Discard &&
		have.DiscardNewPerSubject == want.DiscardNewPerSubject &&
		(want.MaxMsgsPerSubject == 0 || have.MaxMsgsPerSubject == want.MaxMsgsPerSubject) &&
		have.MaxAge == want.MaxAge &&
		(want.Duplicates == 0 || have.Duplicates == want.Duplicates) &&
		have.Replicas == max(want.Replicas, 1) &&
		have.AllowDirect == want.AllowDirect &&
		have.AllowMsgTTL == want.AllowMsgTTL
}

// EnsureKeyValue returns the bucket of cfg: created when missing, updated
// only when a setting execmesh makes differs (see EnsureStream).
func EnsureKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, err
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		sc := bs.StreamInfo().Config
		if sc.Description == cfg.Description && sc.MaxMsgsPerSubject == int64(max(cfg.History, 1)) && sc.MaxAge == cfg.TTL &&
			sc.Replicas == max(cfg.Replicas, 1) && sc.Storage == cfg.Storage && sc.SubjectDeleteMarkerTTL == cfg.LimitMarkerTTL {
			return kv, nil
		}
	}
	return js.CreateOrUpdateKeyValue(ctx, cfg)
}
