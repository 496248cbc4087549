//go:build race

package relay

// raceEnabled: the race detector adds its own allocations, so heap
// accounting per connection means nothing under it.
const raceEnabled = true
