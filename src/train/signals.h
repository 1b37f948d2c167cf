// SIGINT and SIGTERM during training (Note [stopping cleanly]).
//
// Note [stopping cleanly]: SIGINT and SIGTERM only set a flag (the handler does nothing else, so
// it is async-signal-safe); a second of the same signal says so and kills at once (a second Ctrl-C).
// Every rank reports its flag in the step's exchange (train/step.h), so all of them see a signal
// that reached any of them after the same step: each saves its part of the checkpoint, rank 0
// prints the command that resumes, and all return. A SIGKILL cannot be caught; checkpoints are
// written to a staging directory and renamed into place (train/checkpoints.h), so the newest
// complete one survives.
#pragma once

namespace anatomy {

// Installs the handler while any object lives: ranks that are threads of one process share it
// (the first installs it and clears the flag, the last restores the previous handlers).
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  int pending() const;  // SIGINT or SIGTERM once one arrived, else 0
};

}  // namespace anatomy
