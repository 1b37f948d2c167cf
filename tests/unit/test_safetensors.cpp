#include <gtest/gtest.h>

#include "../common/compare.h"
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    m_dir = fs::path(testing::TempDir()) /
            ("anatomy_st_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(m_dir);
    fs::create_directories(m_dir);
  }
  void TearDown() override { fs::remove_all(m_dir); }

  std::string path(const std::string& name) const { return (m_dir / name).string(); }

  static std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void spit(const std::string& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string u64le(uint64_t n) {
    std::string s(8, '\0');
    std::memcpy(s.data(), &n, 8);
    return s;
  }
  // A file with the given header text (its true length) and `data_bytes` zero bytes of data.
  std::string craft(const std::string& name, const std::string& header, size_t data_bytes) {
    std::string p = path(name);
    spit(p, u64le(header.size()) + header + std::string(data_bytes, '\0'));
    return p;
  }

  // Opening `p` must throw an anatomy::Error on one line that names the file and contains `needle`.
  static void expect_open_error(const std::string& p, const std::string& needle) {
    try {
      SafetensorsReader::open(p);
      ADD_FAILURE() << "expected an error for " << p << " (" << needle << ")";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(p), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }

  fs::path m_dir;
};

template <class T>
std::vector<T> iota_vec(size_t n, T start) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

}  // namespace

TEST_F(SafetensorsTest, RoundTripKeepsBytesDtypesShapesAndMetadata) {
  std::mt19937 rng(7);
  std::vector<float> f32(6 * 5);
  for (auto& x : f32) x = std::uniform_real_distribution<float>(-3, 3)(rng);
  std::vector<uint16_t> f16(17), bf16(4 * 4 * 2 * 3);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = f32_to_f16(0.37f * float(i) - 2.f);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(-0.11f * float(i));
  std::vector<double> f64 = {3.141592653589793, -1e300};
  std::vector<int64_t> i64 = {-(int64_t(1) << 62), 0, 42};
  std::vector<int32_t> i32 = iota_vec<int32_t>(9, -4);
  std::vector<uint8_t> u8 = iota_vec<uint8_t>(5, 250);
  float scalar = 2.5f;

  std::vector<SafetensorsEntry> entries = {
      {"w.f32", DType::F32, {6, 5}, f32.data()},
      {"b.f16", DType::F16, {17}, f16.data()},
      {"x.bf16", DType::BF16, {4, 4, 2, 3}, bf16.data()},
      {"d.f64", DType::F64, {2}, f64.data()},
      {"ids.i64", DType::I64, {3}, i64.data()},
      {"m.i32", DType::I32, {3, 3}, i32.data()},
      {"u.u8", DType::U8, {5}, u8.data()},
      {"scalar", DType::F32, {}, &scalar},
      {"empty", DType::F32, {0, 4}, nullptr},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"producer", "anatomy"}};
  const std::string p = path("model.safetensors");
  write_safetensors(p, entries, meta);

  // Layout: header padded to 8 bytes, data contiguous, nothing after.
  std::string bytes = slurp(p);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  size_t data_total = 0;
  for (const auto& e : entries) {
    size_t k = dtype_size(e.dtype);
    for (int64_t d : e.shape) k *= size_t(d);
    data_total += k;
  }
  EXPECT_EQ(bytes.size(), 8 + n + data_total);
  EXPECT_EQ(bytes[8], '{');

  SafetensorsReader r = SafetensorsReader::open(p);
  EXPECT_EQ(r.metadata(), meta);
  ASSERT_EQ(r.tensors().size(), entries.size());
  for (size_t i = 1; i < r.tensors().size(); ++i) EXPECT_LT(r.tensors()[i - 1].name, r.tensors()[i].name);
  for (const auto& e : entries) {
    const SafetensorsTensorInfo& t = r.info(e.name);
    EXPECT_EQ(t.dtype, e.dtype) << e.name;
    EXPECT_EQ(t.shape, e.shape) << e.name;
    std::vector<uint8_t> got = r.read_bytes(e.name);
    ASSERT_EQ(got.size(), t.bytes()) << e.name;
    if (!got.empty()) {
      EXPECT_EQ(std::memcmp(got.data(), e.data, got.size()), 0) << e.name;
    }
  }
  // Typed read, same dtype, through a host Tensor.
  std::vector<float> back(f32.size(), -1.f);
  r.read("w.f32", Tensor(back.data(), DType::F32, Shape{6, 5}, Device::CPU));
  EXPECT_EQ(back, f32);
  EXPECT_FALSE(r.contains("nope"));
  EXPECT_THROW(r.info("nope"), Error);
}

TEST_F(SafetensorsTest, OutputIsDeterministicWhateverTheEntryOrder) {
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  write_safetensors(path("1.safetensors"), {{"b", DType::F32, {2}, b.data()}, {"a", DType::F32, {3}, a.data()}});
  write_safetensors(path("2.safetensors"), {{"a", DType::F32, {3}, a.data()}, {"b", DType::F32, {2}, b.data()}});
  EXPECT_TRUE(testing_compare::same_file_bytes(path("1.safetensors"), path("2.safetensors")));
  // The canonical header for the reference implementation's layout.
  std::string bytes = slurp(path("1.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})");
}

TEST_F(SafetensorsTest, ConvertsHalfFormatsAndDoubleToF32) {
  std::vector<float> ref = {0.f, 1.f, -2.5f, 0.099975586f, 65504.f, -6.1035156e-05f};
  std::vector<uint16_t> f16, bf16;
  std::vector<double> f64;
  for (float x : ref) {
    f16.push_back(f32_to_f16(x));
    bf16.push_back(f32_to_bf16(x));
    f64.push_back(double(x));
  }
  const std::vector<int64_t> shape = {2, 3};
  write_safetensors(path("m.safetensors"), {{"h", DType::F16, shape, f16.data()},
                                            {"b", DType::BF16, shape, bf16.data()},
                                            {"d", DType::F64, shape, f64.data()},
                                            {"f", DType::F32, shape, ref.data()}});
  SafetensorsReader r = SafetensorsReader::open(path("m.safetensors"));
  std::vector<float> out(6);
  r.read("h", DType::F32, out.data(), shape);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(out[i], f16_to_f32(f16[i])) << i;
  r.read("b", DType::F32, out.data(), shape);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(out[i], bf16_to_f32(bf16[i])) << i;
  r.read("d", DType::F32, out.data(), shape);
  EXPECT_EQ(out, ref);
  // And down: F32 -> BF16 rounds like f32_to_bf16.
  std::vector<uint16_t> down(6);
  r.read("f", DType::BF16, down.data(), shape);
  EXPECT_EQ(down, bf16);
}

TEST_F(SafetensorsTest, IntegerConversionChecksRangeAndFloatToIntIsRefused) {
  std::vector<int64_t> big = {1, int64_t(1) << 40};
  std::vector<int64_t> small = {-3, 7};
  write_safetensors(path("i.safetensors"), {{"big", DType::I64, {2}, big.data()}, {"small", DType::I64, {2}, small.data()}});
  SafetensorsReader r = SafetensorsReader::open(path("i.safetensors"));
  std::vector<int32_t> out(2);
  r.read("small", DType::I32, out.data(), std::vector<int64_t>{2});
  EXPECT_EQ(out, (std::vector<int32_t>{-3, 7}));
  try {
    r.read("big", DType::I32, out.data(), std::vector<int64_t>{2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit I32"), std::string::npos) << e.what();
  }
  std::vector<float> f(2);
  EXPECT_THROW(r.read("small", DType::F32, f.data(), std::vector<int64_t>{2}), Error);
}

TEST_F(SafetensorsTest, ShapeMismatchNamesTensorShapesAndSource) {
  std::vector<float> w(64 * 32);
  const std::string name = "bert.encoder.layer.0.attention.self.query.weight";
  write_safetensors(path("model.safetensors"), {{name, DType::F32, {64, 32}, w.data()}});
  SafetensorsReader r = SafetensorsReader::open(path("model.safetensors"));
  std::vector<float> dst(64 * 64);
  try {
    r.read(name, DType::F32, dst.data(), std::vector<int64_t>{64, 64}, "config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path("model.safetensors") + ": tensor '" + name +
                                         "' has shape [64, 32], expected [64, 64] from config.json");
  }
}

TEST_F(SafetensorsTest, MalformedFilesAreOneLineErrorsNamingTheFile) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  auto tensor = [](const std::string& body) { return R"({"a":{)" + body + "}}"; };

  expect_open_error(path("missing.safetensors"), "cannot open");
  expect_open_error(m_dir.string(), "not a regular file");
  spit(path("empty"), "");
  expect_open_error(path("empty"), "too short");
  spit(path("short"), "abcde");
  expect_open_error(path("short"), "too short");

  // Header length 2^63, and one just past the end.
  spit(path("huge"), u64le(uint64_t(1) << 63) + ok);
  expect_open_error(path("huge"), "runs past the end of the file");
  spit(path("past"), u64le(ok.size() + 1) + ok);
  expect_open_error(path("past"), "runs past the end of the file");
  // An absurd header that the (sparse) file does hold.
  {
    std::string p = path("sparse");
    spit(p, u64le(kSafetensorsMaxHeaderBytes + 8));
    fs::resize_file(p, kSafetensorsMaxHeaderBytes + 64);
    expect_open_error(p, "MiB limit");
  }

  expect_open_error(craft("zero", "", 0), "not valid JSON at byte");
  expect_open_error(craft("garbage", "{\"a\": [1, 2", 0), "not valid JSON at byte");
  expect_open_error(craft("binary", std::string("\x01\x02\n\xff", 4), 0), "not valid JSON");
  expect_open_error(craft("array", "[1, 2, 3]", 0), "must be a JSON object");
  expect_open_error(craft("entry", R"({"a": 5})", 0), "must be an object");
  expect_open_error(craft("bool", tensor(R"("dtype":"BOOL","shape":[2],"data_offsets":[0,2])"), 2),
                    "unsupported dtype 'BOOL'");
  expect_open_error(craft("f8", tensor(R"("dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2])"), 2),
                    "unsupported dtype");
  expect_open_error(craft("nodtype", tensor(R"("shape":[2],"data_offsets":[0,8])"), 8), "'dtype' must be a string");
  expect_open_error(craft("shape_int", tensor(R"("dtype":"F32","shape":2,"data_offsets":[0,8])"), 8), "'shape'");
  expect_open_error(craft("shape_neg", tensor(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), 8), "'shape'");
  expect_open_error(craft("shape_float", tensor(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"), 8), "'shape'");
  expect_open_error(craft("shape_str", tensor(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])"), 8), "'shape'");
  expect_open_error(craft("shape_big", tensor(R"("dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8])"), 8),
                    "'shape'");
  expect_open_error(craft("shape_overflow",
                          tensor(R"("dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8])"), 8),
                    "too large");
  expect_open_error(craft("off_one", tensor(R"("dtype":"F32","shape":[2],"data_offsets":[0])"), 8), "'data_offsets'");
  expect_open_error(craft("off_neg", tensor(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"), 8), "'data_offsets'");
  expect_open_error(craft("off_rev", tensor(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"), 8), "end before");
  expect_open_error(craft("off_size", tensor(R"("dtype":"F32","shape":[2],"data_offsets":[0,12])"), 12), "needs 8");
  expect_open_error(craft("off_past", tensor(R"("dtype":"F32","shape":[2],"data_offsets":[8,16])"), 12),
                    "past the end of the data buffer");
  expect_open_error(craft("off_huge", tensor(R"("dtype":"U8","shape":[8],"data_offsets":[18446744073709551608,0])"), 8),
                    "'data_offsets'");
  expect_open_error(craft("overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
                    "overlap");
  expect_open_error(craft("alias", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                          8),
                    "overlap");
  expect_open_error(craft("dup", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                          16),
                    "key 'a' twice");
  expect_open_error(craft("meta", R"({"__metadata__":{"format":1}})", 0), "must be a string");
  expect_open_error(craft("meta_arr", R"({"__metadata__":[]})", 0), "'__metadata__' must be an object");
  // A hostile name with control characters is escaped so the message stays one line.
  expect_open_error(craft("newline", R"({"a\nb":{"dtype":"X","shape":[],"data_offsets":[0,0]}})", 0), "a\\x0ab");

  // Truncated data: a good file missing its last bytes.
  std::vector<float> v(16, 1.f);
  write_safetensors(path("trunc.safetensors"), {{"a", DType::F32, {16}, v.data()}});
  fs::resize_file(path("trunc.safetensors"), fs::file_size(path("trunc.safetensors")) - 4);
  expect_open_error(path("trunc.safetensors"), "past the end of the data buffer");

  // Zero-sized tensors may share an offset with anything; the good header opens.
  SafetensorsReader r = SafetensorsReader::open(
      craft("zero_size", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            8));
  EXPECT_EQ(r.tensors().size(), 2u);
}

TEST_F(SafetensorsTest, WriterRefusesBadEntriesAndLeavesTheTargetAlone) {
  const std::string p = path("model.safetensors");
  std::vector<float> a = {1, 2};
  write_safetensors(p, {{"a", DType::F32, {2}, a.data()}});
  const std::string before = slurp(p);
  EXPECT_THROW(write_safetensors(p, {{"a", DType::F32, {2}, a.data()}, {"a", DType::F32, {2}, a.data()}}), Error);
  EXPECT_THROW(write_safetensors(p, {{"__metadata__", DType::F32, {2}, a.data()}}), Error);
  EXPECT_THROW(write_safetensors(p, {{"a", DType::F32, {-2}, a.data()}}), Error);
  EXPECT_THROW(write_safetensors(p, {{"a", DType::F32, {2}, nullptr}}), Error);
  EXPECT_THROW(write_safetensors(p, {{"\xff\xfe", DType::F32, {2}, a.data()}}), Error);
  EXPECT_EQ(slurp(p), before);
  try {
    write_safetensors(path("no/such/dir/x.safetensors"), {{"a", DType::F32, {2}, a.data()}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.safetensors"), std::string::npos) << e.what();
  }
  // Nothing but the one file: no temporary left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(m_dir), fs::directory_iterator()), 1);
}

TEST_F(SafetensorsTest, AtomicFileAppearsOnlyOnCommit) {
  const std::string p = path("config.json");
  write_file_atomic(p, "old");
  {
    AtomicFile f(p);
    f.write("new contents");
    EXPECT_EQ(slurp(p), "old");
    EXPECT_TRUE(fs::exists(f.temp_path()));
    // Destroyed without commit: as if the process died mid-write.
  }
  EXPECT_EQ(slurp(p), "old");
  write_file_atomic(p, "new");
  EXPECT_EQ(slurp(p), "new");
  EXPECT_EQ(std::distance(fs::directory_iterator(m_dir), fs::directory_iterator()), 1);
}

TEST_F(SafetensorsTest, AtomicDirReplacesAnOldDirectoryWhole) {
  const std::string out = path("runs/checkpoint");
  {
    AtomicDir d(out);
    write_file_atomic(d.file("config.json"), "{\"v\": 1}");
    write_file_atomic(d.file("stale.bin"), "x");
    EXPECT_FALSE(fs::exists(out));
    d.commit();
  }
  EXPECT_EQ(slurp(out + "/config.json"), "{\"v\": 1}");
  {
    AtomicDir d(out + "/");  // a trailing slash names the same directory
    std::ofstream(d.file("config.json")) << "{\"v\": 2}";
    EXPECT_EQ(slurp(out + "/config.json"), "{\"v\": 1}");
    d.commit();
  }
  EXPECT_EQ(slurp(out + "/config.json"), "{\"v\": 2}");
  EXPECT_FALSE(fs::exists(out + "/stale.bin"));
  {
    AtomicDir d(out);
    write_file_atomic(d.file("config.json"), "{\"v\": 3}");
  }  // abandoned
  EXPECT_EQ(slurp(out + "/config.json"), "{\"v\": 2}");
  EXPECT_EQ(std::distance(fs::directory_iterator(path("runs")), fs::directory_iterator()), 1);

  spit(path("plain"), "file");
  EXPECT_THROW(AtomicDir(path("plain")), Error);
}

TEST_F(SafetensorsTest, RandomlyCorruptedFilesNeverCrash) {
  std::vector<float> a(12, 1.f);
  std::vector<uint16_t> b(6, 0x3c00);
  write_safetensors(path("good.safetensors"), {{"a", DType::F32, {3, 4}, a.data()}, {"b", DType::BF16, {6}, b.data()}},
                    {{"format", "pt"}});
  const std::string good = slurp(path("good.safetensors"));
  std::mt19937 rng(1234);
  const std::string p = path("bad.safetensors");
  int opened = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    std::string bytes = good;
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0: bytes[at] = char(rng()); break;                                  // flip a byte
        case 1: bytes[at] = "0123456789[]{}\",:-e."[rng() % 20]; break;          // JSON-ish byte
        case 2: bytes.resize(at); break;                                        // truncate
        default: bytes.insert(at, 1, "0123456789,[]"[rng() % 13]); break;       // insert
      }
      if (bytes.empty()) break;
    }
    spit(p, bytes);
    try {
      SafetensorsReader r = SafetensorsReader::open(p);
      ++opened;
      for (const auto& t : r.tensors()) {
        std::vector<uint8_t> raw = r.read_bytes(t.name);
        EXPECT_EQ(raw.size(), t.bytes());
      }
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(opened, 0);  // some mutations (e.g. inside the data) leave a valid file
}
