// UTF-8 and byte-level helpers shared by the tokenizers. Code points are uint32_t; invalid UTF-8 never
// aborts: decoders report it and callers substitute U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace stoke::tok {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Decodes one code point at s[*pos] and advances *pos. On invalid or truncated input returns false and
// advances *pos by one byte.
bool DecodeUtf8(std::string_view s, size_t* pos, uint32_t* cp);
void AppendUtf8(uint32_t cp, std::string* out);
// Byte offset of the first invalid or truncated sequence, or std::string_view::npos if `s` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view s);
std::string CodepointToUtf8(uint32_t cp);

// Length of the prefix of `s` that does not end in an incomplete (but so far valid) multi-byte sequence:
// what a streaming decoder may emit now. Invalid bytes count as complete (they become U+FFFD).
size_t CompleteUtf8Prefix(std::string_view s);
// Replaces every invalid or truncated sequence with U+FFFD (one per maximal invalid subpart, as WHATWG does).
std::string SanitizeUtf8(std::string_view s);

// GPT-2 byte-level alphabet (model-formats.md §6): byte -> the UTF-8 of its printable stand-in code point.
const std::string& ByteToUnicode(uint8_t b);
// Inverse: stand-in code point -> byte, or -1 if `cp` is not in the alphabet.
int UnicodeToByte(uint32_t cp);
// Maps every byte of `text` to its stand-in (the form vocab and merges are written in).
std::string ByteLevelEncode(std::string_view text);
// Maps stand-ins back to bytes; a code point outside the alphabet is copied as its own UTF-8.
std::string ByteLevelDecode(std::string_view token);

}  // namespace stoke::tok
