// Reading a run directory for the report: every input is validated here and reduced to the
// plain numbers the page draws, so the page's script never meets an unexpected type.
//
// Formats read (keys not listed are ignored; numbers may be integers or floats):
//   train_results.json   required; an object written by the trainer (src/train/trainer.cpp):
//                        train_runtime, train_samples_per_second, steady_samples_per_second,
//                        train_loss, device, precision, per_device_train_batch_size,
//                        gradient_accumulation_steps, gradient_checkpointing, optim, seq_len,
//                        num_parameters, steps, samples, skipped_steps, data_wait_s,
//                        gpu_memory_occupied_mb (-1: not measured), cuda_context_mb, weights_mb,
//                        allocator_peak_bytes {category: bytes}, planned_bytes {category: bytes}
//   metrics.jsonl        one object per line: step, loss, learning_rate, samples_per_second,
//                        elapsed_s, data_wait_s, loss_scale, gpu_memory_used_mb (optional)
//   nvml.jsonl           one object per line: t_s, gpu_memory_used_mb, gpu_util_pct, mem_util_pct,
//                        sm_clock_mhz, power_w, clock_event_reasons (Note [clock and power])
//   profile.json         {steps_profiled, step_time_ms, forward_ms, backward_ms, optimizer_ms,
//                         data_ms (optional), ceilings: {tflops, gbps}, sm_clock_mhz (optional:
//                         {profiled_steps, ceilings, max}, Note [clock and power]),
//                         ops: [{name, class, phase, calls, time_ms, flops, bytes}],
//                         classes: [{class, flops_pct, time_pct, tflops, gbps}]}
//                        time_ms, flops and bytes of an op are totals over its calls in one
//                        step; phase may also be "data". classes is computed from ops when
//                        absent; a class with zero flops and zero time is not shown.
//   memory_timeline.json {events: [{label, phase, bytes: {category: bytes}}]}: live bytes per
//                        category after each op of one step.
// Categories: weights, optimizer_state, gradients, activations, temporary, workspace, other.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anatomy::report {

struct RunData {
  std::string dir;    // as given
  std::string label;  // the directory's name (the full path when two runs share a name)
  nlohmann::json results;  // train_results.json as read (an object)
  // Normalized inputs; null when the file is missing or unusable (see notes).
  nlohmann::json metrics;   // {step:[], loss:[], lr:[], sps:[], elapsed:[], mem:[]} (null entries allowed)
  nlohmann::json nvml;      // {t:[], mem:[], util:[], mutil:[]}
  nlohmann::json profile;   // {step_ms, forward_ms, backward_ms, optimizer_ms, data_ms, steps_profiled,
                            //  ceil_tflops, ceil_gbps,
                            //  ops:[{name, cls, phase, calls, ms, flops, bytes}],
                            //  classes:[{cls, flops_pct, time_pct, tflops, gbps}]}
  nlohmann::json timeline;  // {label:[], phase:[], bytes:{category:[]}}
  // One sentence per missing or partly unreadable input, naming the file and what is lost.
  std::vector<std::string> notes;
};

// The memory categories in the allocator's order.
const std::vector<std::string>& category_names();
// The op classes in the profiler's order.
const std::vector<std::string>& class_names();

// Reads one run directory; throws anatomy::Error when it or its train_results.json is missing
// or unreadable.
RunData load_run(const std::string& dir);

// Loads every directory and gives each a distinct label.
std::vector<RunData> load_runs(const std::vector<std::string>& dirs);

// A number read from `j[key]`, or NaN when it is absent or not a number.
double number_or_nan(const nlohmann::json& j, const char* key);
// A string read from `j[key]`, or "" when it is absent or not a string.
std::string string_or_empty(const nlohmann::json& j, const char* key);

}  // namespace anatomy::report
