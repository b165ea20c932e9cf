// Stop strings on streamed text: generation ends just before the first stop string, which is never emitted,
// and text that could still become the start of one is held back until the next piece decides.
//
//   StopFilter f({"\n\nUser:"});
//   f.Push("Hello\n")  -> {text "Hello", stopped false}   ("\n" held: it may start the stop string)
//   f.Push("\nUser:")  -> {text "",      stopped true}    (the stop string completed: nothing more is
//   emitted)
//
// An occurrence always lies inside the held text: whatever was emitted could not have been its start.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace stoke {

class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string completed; `text` is everything before it
  };
  Result Push(std::string_view piece);
  // End of generation without a stop: the held text is emitted.
  std::string Flush();

  bool empty() const { return stops_.empty(); }
  size_t held_size() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;  // non-empty strings only
  std::string held_;
  bool stopped_ = false;
};

}  // namespace stoke
