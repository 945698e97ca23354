package loop

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/toolnexus/operator/internal/backoff"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

// Run runs prompt to completion in process. It is Resume on a fresh State.
func (c *Client) Run(ctx context.Context, prompt string, tk *tools.Toolkit) (RunResult, error) {
	return c.Resume(ctx, NewState(prompt), tk)
}

// Resume drives st with Step until the run ends or waits. Transient model errors are retried with
// exponential backoff (Options.Retries, RetryBase, honouring Retry-After). Suspensions go to
// WaitFor, at most once each; without WaitFor the run returns StatusPending and st can be
// answered and resumed later. When ctx expires the result is incomplete with LimitTimeout, and
// the context's error is returned with it.
func (c *Client) Resume(ctx context.Context, st *State, tk *tools.Toolkit) (RunResult, error) {
	for {
		var err error
		switch st.Next() {
		case ActionFinished:
			return st.Result(), nil
		case ActionWaiting:
			switch {
			case len(st.Suspended()) > 0 && c.opts.WaitFor != nil:
				err = c.waitFor(ctx, st)
			case len(st.Suspended()) == 0 && len(st.Waiting()) > 0:
				err = c.awaitWork(ctx, st)
			default:
				return st.Result(), nil
			}
		default:
			err = c.stepWithRetries(ctx, st, tk)
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
				st.Status, st.Limit = StatusIncomplete, LimitTimeout
			}
			return st.Result(), err
		}
	}
}

func (c *Client) stepWithRetries(ctx context.Context, st *State, tk *tools.Toolkit) error {
	for attempt := 0; ; attempt++ {
		_, err := c.Step(ctx, st, tk)
		retry, after := Retryable(err)
		if !retry || attempt >= c.opts.Retries || ctx.Err() != nil {
			return err
		}
		if err := c.sleep(ctx, backoff.Delay(c.opts.RetryBase, attempt+1, after)); err != nil {
			return err
		}
	}
}

// waitFor asks WaitFor about every open request concurrently (a parked WaitFor for one call must
// not hold up another, nor one request of a round another) and records the answers in order.
func (c *Client) waitFor(ctx context.Context, st *State) error {
	open := st.Open()
	answers := make([]tools.Answer, len(open))
	errs := make([]error, len(open))
	var wg sync.WaitGroup
	for i, o := range open {
		wg.Go(func() { answers[i], errs[i] = c.opts.WaitFor(ctx, o.Ask.Request) })
	}
	wg.Wait()
	refused := map[string]bool{}
	for i, o := range open {
		if errs[i] != nil {
			return fmt.Errorf("loop: WaitFor for %s (request %s): %w", o.Call.Name, o.Ask.Request.ID, errs[i])
		}
		if refused[o.Call.ID] {
			continue // a refusal of an earlier request of its round finished the call
		}
		if err := st.AnswerAsk(o.Call.ID, o.Ask.Index, answers[i]); err != nil {
			return fmt.Errorf("loop: WaitFor answered %s unusably: %w", o.Call.Name, err)
		}
		refused[o.Call.ID] = !answers[i].OK
	}
	return nil
}

// awaitWork sleeps until a look at the work a call waits on is due, as the host's Settle would
// wake it. In process nothing can stop abandoned work: there is no host to carry the effect out.
func (c *Client) awaitWork(ctx context.Context, st *State) error {
	out := state.Settle(st, nil, nil, c.now(), state.Policy{})
	if out.WakeAt.IsZero() {
		return nil
	}
	return c.sleep(ctx, out.WakeAt.Sub(c.now()))
}
