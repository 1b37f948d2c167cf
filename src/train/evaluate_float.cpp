#include "train/evaluate_float.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace anatomy {

namespace {

void check_sizes(std::span<const float> a, std::span<const float> b, const char* what) {
  ANATOMY_CHECK(a.size() == b.size() && !a.empty(), what, ": ", a.size(), " outputs for ", b.size(), " targets");
}

std::string class_name(const std::map<int, std::string>& id2label, int64_t c) {
  auto it = id2label.find(static_cast<int>(c));
  return it != id2label.end() ? it->second : std::to_string(c);
}

std::span<const float> row_of(const std::vector<float>& v, int64_t i, int64_t c) {
  return {v.data() + i * c, static_cast<size_t>(c)};
}

}  // namespace

double mean_squared_error(std::span<const float> outputs, std::span<const float> targets) {
  check_sizes(outputs, targets, "mean_squared_error");
  double s = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const double d = static_cast<double>(outputs[i]) - targets[i];
    s += d * d;
  }
  return s / static_cast<double>(outputs.size());
}

double pearson(std::span<const float> x, std::span<const float> y) {
  check_sizes(x, y, "pearson");
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += x[i] / n;
    my += y[i] / n;
  }
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx == 0 || syy == 0) return std::nan("");
  return sxy / std::sqrt(sxx * syy);
}

double micro_f1_at_half(std::span<const float> logits, std::span<const float> targets) {
  check_sizes(logits, targets, "micro_f1");
  double tp = 0, fp = 0, fn = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const bool pred = logits[i] > 0.0f, truth = targets[i] > 0.5f;
    tp += pred && truth;
    fp += pred && !truth;
    fn += !pred && truth;
  }
  return tp + fp + fn == 0 ? 0.0 : 2 * tp / (2 * tp + fp + fn);
}

double float_label_loss(ProblemType p, std::span<const float> x, std::span<const float> t) {
  check_sizes(x, t, "float_label_loss");
  double s = 0;
  for (size_t c = 0; c < x.size(); ++c) {
    const double v = x[c], y = t[c];
    s += p == ProblemType::MultiLabel ? std::max(v, 0.0) - v * y + std::log1p(std::exp(-std::abs(v))) : (v - y) * (v - y);
  }
  return s / static_cast<double>(x.size());
}

void finish_float_metrics(EvalResult& r) {
  double loss = 0;
  for (double l : r.losses) loss += l;
  r.loss = loss / static_cast<double>(std::max<size_t>(1, r.losses.size()));
  if (r.problem == ProblemType::Regression) {
    r.mse = mean_squared_error(r.outputs, r.targets);
    r.pearson = pearson(r.outputs, r.targets);
  } else {
    r.micro_f1 = r.f1 = micro_f1_at_half(r.outputs, r.targets);  // f1: run_classification.py's name for it
  }
}

// A string as Python's repr() writes it: single quotes unless it holds one and no double quote.
static std::string python_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == '\\' || c == q) out += '\\';
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out + q;
}

std::string float_prediction_text(const EvalResult& r, int64_t i, const std::map<int, std::string>& id2label) {
  const std::span<const float> x = row_of(r.outputs, i, r.num_labels);
  std::string out;
  for (size_t c = 0; c < x.size(); ++c) {
    if (r.problem == ProblemType::Regression) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(x[c]));
      if (c) out += ',';
      out += buf;
    } else if (x[c] > 0.0f) {  // the predicted classes as run_classification.py writes them: a Python list
      if (!out.empty()) out += ", ";
      out += python_repr(class_name(id2label, static_cast<int64_t>(c)));
    }
  }
  return r.problem == ProblemType::Regression ? out : "[" + out + "]";
}

// Float32 values as the shortest decimals that read back as them (a label 4.22 is written 4.22,
// not 4.21999979019165); one value or a list.
static nlohmann::json shortest(std::span<const float> v) {
  nlohmann::json out = nlohmann::json::array();
  for (const float x : v) {
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
    out.push_back(std::strtod(std::string(buf, ec == std::errc() ? end : buf).c_str(), nullptr));
  }
  return v.size() == 1 ? out[0] : out;
}

std::string float_prediction_line(const EvalResult& r, int64_t i, const std::map<int, std::string>& id2label) {
  const int64_t C = r.num_labels;
  const std::span<const float> x = row_of(r.outputs, i, C);
  nlohmann::ordered_json j = {{"index", i}};
  if (r.problem == ProblemType::Regression) {
    j["prediction"] = shortest(x);
    if (r.labelled) j["label"] = shortest(row_of(r.targets, i, C));
    return j.dump();
  }
  std::vector<std::string> names, truth;
  std::vector<int64_t> ids;
  std::vector<float> probs;
  for (int64_t c = 0; c < C; ++c) {
    if (x[c] > 0.0f) {
      names.push_back(class_name(id2label, c));
      ids.push_back(c);
    }
    probs.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[c])))));
    if (r.labelled && r.targets[i * C + c] > 0.5f) truth.push_back(class_name(id2label, c));
  }
  j["prediction"] = names;
  j["prediction_ids"] = ids;
  if (r.labelled) j["label"] = truth;
  j["probabilities"] = probs;
  return j.dump();
}

}  // namespace anatomy
