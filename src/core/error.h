// One error type and one check macro for the whole project. Checks throw; destructors never do.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace anatomy {

// A user-facing error: its what() is one line naming the file or flag and what is wrong.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

template <class... A>
[[noreturn]] void fail(const A&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  throw Error(os.str());
}

template <class... A>
std::string str_cat(const A&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  return os.str();
}

}  // namespace anatomy

// ANATOMY_CHECK(cond, "message", value, ...) throws anatomy::Error with the message.
// Internal invariants add file:line; user-facing checks should phrase a complete sentence.
#define ANATOMY_CHECK(cond, ...)                    \
  do {                                              \
    if (!(cond)) ::anatomy::fail(__VA_ARGS__);      \
  } while (0)

#define ANATOMY_ASSERT(cond)                                                                 \
  do {                                                                                       \
    if (!(cond)) ::anatomy::fail("internal error: ", #cond, " (", __FILE__, ":", __LINE__, ")"); \
  } while (0)
