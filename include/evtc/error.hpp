// evtc error types. Three kinds, kept apart on purpose:
//  - UserError: the input (an expression, a graph, an operand) is wrong; the message says
//    what was wrong and, where possible, what was expected.
//  - InternalError: evtc itself is wrong (a broken invariant). Never the user's fault.
//  - RuntimeError: the environment failed (CUDA, the compiler, the file system).
#pragma once
#include <stdexcept>
#include <string>

namespace evtc {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UserError : public Error {
 public:
  using Error::Error;
};

class InternalError : public Error {
 public:
  using Error::Error;
};

class RuntimeError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void internal_fail(const char* file, int line, const std::string& what);

}  // namespace evtc

// Checks an invariant of evtc's own code; a failure is a bug in evtc, not in the input.
#define EVTC_INTERNAL_ASSERT(cond, msg)                                      \
  do {                                                                       \
    if (!(cond)) ::evtc::internal_fail(__FILE__, __LINE__, std::string(#cond ": ") + (msg)); \
  } while (0)
