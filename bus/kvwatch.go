package bus

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// inProcessWatchHeartbeat is the idle heartbeat of a watch's consumer on
// an in-process connection (the embedded server of `execmesh up`).
// nats.go's kv.Watch asks for one every 5 s and checks for it every 10 s,
// which over the network notices a server restarted on an empty store;
// in one process no link can fail and no reconnect happens, and six
// watches at 5 s kept an idle daemon waking twice a second.
const inProcessWatchHeartbeat = time.Minute

// kvHandle is a bucket opened by OpenKeyValue or a KVView: it keeps the
// connection, so that WatchKeyValue can tell an in-process one.
type kvHandle struct {
	jetstream.KeyValue
	nc *nats.Conn
}

// withConn returns kv with js's connection (kv itself on error).
func withConn(kv jetstream.KeyValue, js jetstream.JetStream) jetstream.KeyValue {
	if kv == nil || js == nil {
		return kv
	}
	return &kvHandle{KeyValue: kv, nc: js.Conn()}
}

// inProcessConn returns the in-process connection kv was opened on, or
// nil.
func inProcessConn(kv jetstream.KeyValue) *nats.Conn {
	h, ok := kv.(*kvHandle)
	if !ok || h.nc == nil || h.nc.Opts.InProcessServer == nil {
		return nil
	}
	return h.nc
}

// kvEntry is one value or change a watch delivers.
type kvEntry struct {
	bucket, key string
	value       []byte
	rev, delta  uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *kvEntry) Bucket() string                  { return e.bucket }
func (e *kvEntry) Key() string                     { return e.key }
func (e *kvEntry) Value() []byte                   { return e.value }
func (e *kvEntry) Revision() uint64                { return e.rev }
func (e *kvEntry) Created() time.Time              { return e.created }
func (e *kvEntry) Delta() uint64                   { return e.delta }
func (e *kvEntry) Operation() jetstream.KeyValueOp { return e.op }

// kvOperation is the operation a bucket message stands for: as nats.go's
// watch reads it, a delete or purge from the KV-Operation header, and a
// key removed by its TTL or a purge marker from Nats-Marker-Reason.
func kvOperation(h nats.Header) jetstream.KeyValueOp {
	if len(h) == 0 {
		return jetstream.KeyValuePut
	}
	if op := h.Get("KV-Operation"); op != "" {
		switch op {
		case "DEL":
			return jetstream.KeyValueDelete
		case "PURGE":
			return jetstream.KeyValuePurge
		}
		return jetstream.KeyValuePut
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge":
		return jetstream.KeyValuePurge
	case "Remove":
		return jetstream.KeyValueDelete
	}
	return jetstream.KeyValuePut
}

// watchInProcess is WatchKeyValue on an in-process connection: the same
// ordered consumer (last value per key, then every change) as kv.Watch,
// with a heartbeat of inProcessWatchHeartbeat.
func watchInProcess(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, filter string, loaded func(), apply func(jetstream.KeyValueEntry)) error {
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	bucket := kv.Bucket()
	pre := "$KV." + bucket + "."
	updates := make(chan jetstream.KeyValueEntry, 256)
	done, closed := make(chan struct{}), make(chan struct{})
	defer close(done)
	send := func(e jetstream.KeyValueEntry) {
		select {
		case updates <- e:
		case <-done:
		}
	}
	// mu keeps the first deliveries waiting until the initial count is
	// known (as nats.go's watch does).
	var mu sync.Mutex
	var initDone bool
	var received, initPending uint64
	mu.Lock()
	sub, err := js.Subscribe(pre+filter, func(m *nats.Msg) {
		meta, err := m.Metadata()
		if err != nil || len(m.Subject) <= len(pre) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		send(&kvEntry{bucket: bucket, key: m.Subject[len(pre):], value: m.Data, rev: meta.Sequence.Stream,
			delta: meta.NumPending, created: meta.Timestamp, op: kvOperation(m.Header)})
		if !initDone {
			received++
			if received >= initPending || meta.NumPending == 0 {
				initDone = true
				send(nil)
			}
		}
	}, nats.BindStream(KeyValueStream(bucket)), nats.OrderedConsumer(), nats.IdleHeartbeat(inProcessWatchHeartbeat),
		nats.DeliverLastPerSubject(), nats.Context(ctx))
	if err != nil {
		mu.Unlock()
		return err
	}
	defer sub.Unsubscribe() //nolint:errcheck
	var closeOnce sync.Once
	sub.SetClosedHandler(func(string) { closeOnce.Do(func() { close(closed) }) })
	if n, err := sub.InitialConsumerPending(); err == nil {
		if n == 0 {
			initDone = true
			send(nil)
		} else {
			initPending = n
		}
	}
	mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-closed:
			return errors.New("watch ended")
		case e := <-updates:
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
