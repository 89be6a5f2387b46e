package bus

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KVView follows the keys of one KV bucket below a prefix into memory, so
// that reads cost nothing and every process of a deployment sees the
// writes of the others within a moment. Values are JSON. Its methods are
// safe for concurrent use; Run must run for the view to follow the bucket
// (a write through the view is seen at once by its own process).
type KVView[T any] struct {
	js       jetstream.JetStream
	cfg      jetstream.KeyValueConfig
	prefix   string // key prefix, "" for every key
	log      *slog.Logger
	mu       sync.RWMutex
	kv       jetstream.KeyValue
	values   map[string]T
	revision map[string]uint64
}

// NewKVView returns a view of the keys starting with keyPrefix in the
// bucket cfg describes (created with cfg when missing).
func NewKVView[T any](js jetstream.JetStream, cfg jetstream.KeyValueConfig, keyPrefix string, log *slog.Logger) *KVView[T] {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &KVView[T]{js: js, cfg: cfg, prefix: keyPrefix, log: log, values: map[string]T{}, revision: map[string]uint64{}}
}

func (v *KVView[T]) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	v.mu.RLock()
	kv := v.kv
	v.mu.RUnlock()
	if kv != nil {
		return kv, nil
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := v.js.KeyValue(actx, v.cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = EnsureKeyValue(actx, v.js, v.cfg)
	}
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	v.kv = kv
	v.mu.Unlock()
	return kv, nil
}

// Run follows the bucket until ctx ends, again after a failure.
func (v *KVView[T]) Run(ctx context.Context) {
	filter := ">"
	if v.prefix != "" {
		filter = v.prefix + ">"
	}
	RetryForever(ctx, v.log, "KV view of "+v.cfg.Bucket+" not followed", func(ctx context.Context) error {
		kv, err := v.bucket(ctx)
		if err != nil {
			return err
		}
		err = WatchKeyValue(ctx, kv, filter, nil, func(e jetstream.KeyValueEntry) {
			v.apply(e.Key(), e.Revision(), e.Operation() == jetstream.KeyValuePut, e.Value())
		})
		v.mu.Lock()
		v.kv = nil
		v.mu.Unlock()
		return err
	})
}

func (v *KVView[T]) apply(key string, rev uint64, put bool, data []byte) {
	if !strings.HasPrefix(key, v.prefix) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if rev <= v.revision[key] {
		return
	}
	v.revision[key] = rev
	if !put {
		delete(v.values, key)
		return
	}
	var val T
	if err := json.Unmarshal(data, &val); err != nil {
		v.log.Warn("malformed KV value ignored", "bucket", v.cfg.Bucket, "key", key, "err", err)
		delete(v.values, key)
		return
	}
	v.values[key] = val
}

// Get returns the value of key as last seen.
func (v *KVView[T]) Get(key string) (T, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	val, ok := v.values[key]
	return val, ok
}

// Put writes key (which must start with the view's prefix).
func (v *KVView[T]) Put(ctx context.Context, key string, val T) error {
	kv, err := v.bucket(ctx)
	if err != nil {
		return err
	}
	b, err := json.Marshal(val)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rev, err := kv.Put(actx, key, b)
	if err != nil {
		return err
	}
	v.apply(key, rev, true, b)
	return nil
}

// Delete removes key.
func (v *KVView[T]) Delete(ctx context.Context, key string) error {
	kv, err := v.bucket(ctx)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := kv.Delete(actx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	v.mu.Lock()
	delete(v.values, key)
	v.mu.Unlock()
	return nil
}
