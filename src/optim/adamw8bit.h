// Block-wise 8-bit AdamW (--optim adamw-8bit).
//
// Note [8-bit AdamW]
// ~~~~~~~~~~~~~~~~~~
// The two AdamW moments are stored as one byte each: a code into a 256-entry quantization map,
// scaled per block of kQuantBlock (256) consecutive values by that block's absmax (F32). Each
// step dequantizes a block (value = map[code] * absmax), runs the ordinary fp32 AdamW update on
// it (PyTorch semantics: decoupled weight decay, bias correction; the parameter update uses the
// fresh fp32 moments), takes the new absmax of the block (max |m|, max v) and stores for every
// value the code of the map entry nearest to value / absmax (round to nearest over the map,
// ties to the lower code).
//
// The maps are mu-law companding curves (non-linear: dense near zero, roughly constant relative
// spacing above the knee 1/mu), sampled uniformly in the companded domain u:
//   x(u) = sign(u) * ((1 + mu)^|u| - 1) / mu
// - m, signed, mu = 2^10: codes 0..126 are u = -(127 - k)/127, code 127 is exactly 0, codes
//   128..255 are u = (k - 127)/128 (the positive side has one level more). Relative spacing
//   about ln(1025)/128 = 5.4% (rounding error <= 2.7%) from 1 down to ~1e-3; the smallest
//   nonzero magnitude is 5.4e-5 of the block's absmax.
// - v, unsigned, mu = 2^20: codes k = 0..255 are u = k/255; code 0 is exactly 0 and is kept
//   for v == 0 only (a positive v below the first level gets code 1, so the second moment never
//   collapses to zero under a nonzero first moment, which would blow the update up by 1/eps).
//   Relative spacing ln(2^20 + 1)/255 = 5.4% in v, i.e. about 2.7% in sqrt(v).
// Both maps have exact endpoints (+-1, 1) so a block's largest value is stored exactly. They are
// built once on the host in double precision (expm1/log1p) and rounded to float once; the
// optimizer uploads the same 512 floats to the device, so the CPU reference and the CUDA kernel
// quantize against identical tables, and with the shared per-element math of ops/optim_math.h
// they produce identical codes.
//
// Memory: with n the flat length and d its decay-group end, the groups are blocked separately:
//   2 n (two U8 codes) + 8 (ceil(d / 256) + ceil((n - d) / 256)) (two F32 scales per block)
//   + 2048 (the two maps, F32 [512]) bytes,
// about 2.03 bytes per parameter against AdamW's 8.
#pragma once
#include <array>
#include <memory>

#include "optim/optimizer.h"

namespace anatomy {

inline constexpr double kQuantMuSigned = 1024.0;     // m's map
inline constexpr double kQuantMuUnsigned = 1048576.0;  // v's map

// One 256-entry map, sorted ascending (see the note).
std::array<float, 256> quantization_map(bool is_signed);
// Both maps as the backend takes them: signed (m) then unsigned (v), F32 [512].
std::array<float, 512> adamw8bit_qmap();

// Quantization blocks of the two groups [0, d) and [d, n).
size_t adamw8bit_blocks(const ParamLayout& layout);
size_t adamw8bit_state_bytes(const ParamLayout& layout);
std::unique_ptr<Optimizer> make_adamw8bit(Backend& be, const OptimizerOptions& o, const ParamLayout& layout);

}  // namespace anatomy
