// Package memguard reads how much memory the node has left, so the node can
// refuse work instead of running out ("Nodes protect themselves" in the
// Sandstorm seed: a node short on memory turns work away and still answers
// ssh).
package memguard

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AvailableMiB returns MemAvailable from /proc/meminfo in MiB: the kernel's
// estimate of memory that can be handed out without swapping.
func AvailableMiB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "MemAvailable:") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			break
		}
		kb, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("meminfo: %w", err)
		}
		return kb / 1024, nil
	}
	return 0, fmt.Errorf("meminfo: no MemAvailable line")
}

// Promise is memory a sandbox that is starting or waking is expected to
// take but does not hold yet: it was admitted at ExpectedMiB and holds
// HeldMiB so far.
type Promise struct {
	ExpectedMiB, HeldMiB int64
}

// Outstanding is what the promises still have to take: MemAvailable does
// not show it yet, and a 1 GiB heap that has not been touched still counts.
func Outstanding(ps []Promise) int64 {
	var sum int64
	for _, p := range ps {
		if d := p.ExpectedMiB - p.HeldMiB; d > 0 {
			sum += d
		}
	}
	return sum
}

// Headroom is what can still be promised without eating into the reserve:
// available memory, less the reserve, less what admitted sandboxes have yet
// to take. It is the admission decision of issue 7 ("admission counts what
// sandboxes are about to use"), pure so it can be tested exhaustively.
func Headroom(availMiB, reserveMiB int64, ps []Promise) int64 {
	return availMiB - reserveMiB - Outstanding(ps)
}

// Expected is the size a sandbox is admitted at: its limit, or — once
// sandboxes of its template were seen to settle — a margin above the
// largest of them (never above the limit, never below floorMiB).
func Expected(limitMiB, settledMiB int64) int64 {
	const floorMiB = 16
	if settledMiB <= 0 || limitMiB <= 0 {
		return max(limitMiB, floorMiB)
	}
	e := settledMiB + settledMiB/4 // +25 %: a little growth, or a busier request
	return max(min(e, limitMiB), floorMiB)
}

// PressureSome10 is the share of the last 10 s (in %) in which some task
// waited for memory (/proc/pressure/memory, "some avg10"; Linux PSI).
// It rises before MemAvailable says anything is wrong, because reclaim
// already costs time; -1 if the kernel has no PSI.
func PressureSome10() float64 {
	b, err := os.ReadFile("/proc/pressure/memory")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "some ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "avg10="); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err == nil {
					return x
				}
			}
		}
	}
	return -1
}

// ProtectSelf sets this process's OOM score adjustment (oom_score_adj,
// -1000 to 1000): sandstormd and sam-node lower theirs so that if the
// kernel must kill, it kills a sandbox (which the node raises) instead.
func ProtectSelf(adj int) error {
	return os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(adj)), 0o644)
}

// LowWater samples MemAvailable every interval until Stop and keeps the
// lowest reading: what a flood test or benchmark must hold above the
// reserve at every moment, not only at the end.
type LowWater struct {
	mu   sync.Mutex
	min  int64
	at   time.Time // when min was read: to find it in a daemon's log
	stop chan struct{}
	done chan struct{}
}

// WatchLow starts sampling; the first reading is taken at once.
func WatchLow(interval time.Duration) *LowWater {
	w := &LowWater{stop: make(chan struct{}), done: make(chan struct{})}
	w.min = math.MaxInt64
	w.sample()
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				w.sample()
			}
		}
	}()
	return w
}

func (w *LowWater) sample() {
	m, err := AvailableMiB()
	if err != nil {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if m < w.min {
		w.min, w.at = m, now
	}
}

// Min is the lowest MemAvailable seen so far, in MiB.
func (w *LowWater) Min() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.min
}

// At is when the lowest reading was taken (zero before the first).
func (w *LowWater) At() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at
}

// Stop ends the sampling (once) and returns the lowest reading.
func (w *LowWater) Stop() int64 {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	return w.Min()
}
