// Copyright 2025 The NATS Authors
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// ats controls the go routines for the access time service.
// This allows more efficient unixnano operations for cache access times.
// We will have one per binary (usually per server).
package ats

import (
	"sync/atomic"
	"time"
)

// PATCHED for execmesh: no ticker. The access time is read from the
// clock when asked (a vDSO call, tens of nanoseconds) instead of from a
// value a goroutine refreshes ten times a second, which kept every idle
// process that embeds a server waking ten times a second.

// TickInterval is kept for callers; nothing ticks.
const TickInterval = 100 * time.Millisecond

// How may registered users do we have (kept for the balance check).
var refs atomic.Int64

// Register usage. This will happen on filestore creation.
func Register() { refs.Add(1) }

// Unregister usage.
func Unregister() {
	if v := refs.Add(-1); v < 0 {
		refs.Store(0)
		panic("unbalanced unregister for access time state")
	}
}

// AccessTime returns the time in unix nanoseconds.
func AccessTime() int64 { return time.Now().UnixNano() }
