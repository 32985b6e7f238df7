package node

import "time"

// Run drives the idle timers and the memory guard until Close.
func (n *Node) Run() {
	n.done.Add(3)
	go func() {
		defer n.done.Done()
		n.guard.Loop(n.stop)
	}()
	go func() {
		defer n.done.Done()
		n.pool.Loop(n.stop)
	}()
	go func() {
		defer n.done.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		lastFlush := time.Now()
		for {
			select {
			case <-n.stop:
				return
			case <-tick.C:
			}
			n.tiers.IdleStep(time.Now())
			n.guard.DiskStep()
			if time.Since(lastFlush) > 5*time.Second {
				n.tiers.FlushActivity()
				lastFlush = time.Now()
			}
		}
	}()
}
