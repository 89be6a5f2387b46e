package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// kvTimeout bounds opening a bucket.
const kvTimeout = 5 * time.Second

// OpenKeyValue returns the bucket name of the deployment with subject
// prefix prefix, creating it with its configuration (KeyValueConfigs) when
// it is missing — on first use, or after the store was lost.
func OpenKeyValue(ctx context.Context, js jetstream.JetStream, prefix string, replicas int, name string) (jetstream.KeyValue, error) {
	actx, cancel := context.WithTimeout(ctx, kvTimeout)
	defer cancel()
	kv, err := js.KeyValue(actx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cfg, ok := KeyValueConfigFor(prefix, replicas, name)
		if !ok {
			return nil, fmt.Errorf("bus: no configuration for bucket %s", name)
		}
		kv, err = EnsureKeyValue(actx, js, cfg)
	}
	if err != nil {
		return nil, err
	}
	return kv, nil
}

// RetryForever runs f until ctx ends: f returns when it stops (a watch
// that ended, a bucket that could not be opened), and it is run again
// after a pause that grows with each attempt (to 10 s), the failure
// logged as what ("session index watch stopped").
func RetryForever(ctx context.Context, log *slog.Logger, what string, f func(ctx context.Context) error) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := f(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Warn(what+"; retrying", "attempt", attempt, "err", err)
		if !Backoff(ctx, attempt) {
			return
		}
	}
}

// Backoff sleeps before retry number attempt (1, 2, …): 500 ms per
// attempt so far, at most 10 s. It returns false when ctx ended first.
func Backoff(ctx context.Context, attempt int) bool {
	t := time.NewTimer(min(time.Duration(attempt)*500*time.Millisecond, 10*time.Second))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// WatchKeyValue hands every value of kv below filter (">" for all), then
// every change, to apply until ctx ends (nil) or the watch fails; loaded,
// when set, is called once the current values were handed over. It is
// nats.go's kv.Watch, whose consumer's idle heartbeat (5 s) also tells a
// server restarted on an empty store.
func WatchKeyValue(ctx context.Context, kv jetstream.KeyValue, filter string, loaded func(), apply func(jetstream.KeyValueEntry)) error {
	w, err := kv.Watch(ctx, filter)
	if err != nil {
		return err
	}
	defer w.Stop() //nolint:errcheck
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended")
			}
			if e == nil {
				if loaded != nil {
					loaded()
				}
				continue
			}
			apply(e)
		}
	}
}

// ErrContended is UpdateKey's error when other writers kept changing the
// key between its reads and writes.
var ErrContended = errors.New("bus: key contended")

// UpdateKey changes the JSON value of key by compare-and-set: it reads
// the value (exists says whether there was one; v is then its decoding,
// else the zero T), lets fn change it, and writes it back only if the key
// is still at the revision read (created when it was missing). When
// another writer got there first it reads again and applies fn again, up
// to ten times (ErrContended). fn returns false for no change: nothing is
// written. It returns the value as written (or as read, unchanged), its
// revision (written, or read; 0 for a missing key left alone) and whether
// a write happened. A
// value that does not decode is an error.
func UpdateKey[T any](ctx context.Context, kv jetstream.KeyValue, key string, fn func(v *T, exists bool) bool) (T, uint64, bool, error) {
	var zero T
	for attempt := 0; attempt < 10; attempt++ {
		actx, cancel := context.WithTimeout(ctx, kvTimeout)
		cur, err := kv.Get(actx, key)
		cancel()
		var v T
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return zero, 0, false, err
		default:
			if err := json.Unmarshal(cur.Value(), &v); err != nil {
				return zero, 0, false, fmt.Errorf("bus: %s/%s: %w", kv.Bucket(), key, err)
			}
			rev = cur.Revision()
		}
		if !fn(&v, rev != 0) {
			return v, rev, false, nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return zero, 0, false, err
		}
		actx, cancel = context.WithTimeout(ctx, kvTimeout)
		var nrev uint64
		if rev == 0 {
			nrev, err = kv.Create(actx, key, b)
		} else {
			nrev, err = kv.Update(actx, key, b, rev)
		}
		cancel()
		if err == nil {
			return v, nrev, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !IsWrongLastSequence(err) {
			return zero, 0, false, err
		}
	}
	return zero, 0, false, ErrContended
}
