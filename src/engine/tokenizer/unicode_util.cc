#include "engine/tokenizer/unicode_util.h"

#include <array>

namespace stoke::tok {

bool DecodeUtf8(std::string_view s, size_t* pos, uint32_t* cp) {
  const size_t i = *pos;
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    *pos = i + 1;
    return true;
  }
  int len;
  uint32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80, *cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800, *cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, *cp = b0 & 0x07;
  } else {
    *pos = i + 1;
    return false;
  }
  if (i + len > s.size()) {
    *pos = i + 1;
    return false;
  }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *pos = i + 1;
      return false;
    }
    *cp = (*cp << 6) | (b & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) {
    *pos = i + 1;
    return false;
  }
  *pos = i + len;
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t FindInvalidUtf8(std::string_view s) {
  size_t pos = 0;
  uint32_t cp;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {  // fast path for ASCII
      ++pos;
      continue;
    }
    const size_t at = pos;
    if (!DecodeUtf8(s, &pos, &cp)) return at;
  }
  return std::string_view::npos;
}

std::string CodepointToUtf8(uint32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

namespace {

// Expected sequence length from a lead byte; 0 for a continuation or invalid lead byte.
int SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return b >= 0xC2 ? 2 : 0;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return b <= 0xF4 ? 4 : 0;
  return 0;
}

// Whether s[start..] (shorter than a full sequence) could still become valid with more bytes.
bool IsValidIncompletePrefix(std::string_view s, size_t start) {
  const auto b0 = static_cast<uint8_t>(s[start]);
  const size_t have = s.size() - start;
  for (size_t k = 1; k < have; ++k) {
    const auto b = static_cast<uint8_t>(s[start + k]);
    if ((b & 0xC0) != 0x80) return false;
    if (k == 1) {  // second-byte ranges that rule out overlongs, surrogates and > U+10FFFF
      if (b0 == 0xE0 && b < 0xA0) return false;
      if (b0 == 0xED && b > 0x9F) return false;
      if (b0 == 0xF0 && b < 0x90) return false;
      if (b0 == 0xF4 && b > 0x8F) return false;
    }
  }
  return true;
}

}  // namespace

size_t CompleteUtf8Prefix(std::string_view s) {
  // Only the last 3 bytes can start an incomplete sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    const auto b = static_cast<uint8_t>(s[start]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const int len = SequenceLength(b);
    if (len > static_cast<int>(back) && IsValidIncompletePrefix(s, start)) return start;
    return n;
  }
  return n;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    uint32_t cp;
    if (DecodeUtf8(s, &pos, &cp)) {
      out.append(s.substr(start, pos - start));
      continue;
    }
    // Maximal subpart: a valid lead byte followed by valid continuations, cut short.
    const int len = SequenceLength(static_cast<uint8_t>(s[start]));
    size_t end = start + 1;
    if (len > 1) {
      while (end < s.size() && end - start < static_cast<size_t>(len) &&
             IsValidIncompletePrefix(s.substr(0, end + 1), start)) {
        ++end;
      }
    }
    AppendUtf8(kReplacementChar, &out);
    pos = end;
  }
  return out;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cp_to_byte;  // stand-ins are all < U+0200
  ByteTables() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      byte_to_utf8[b] = CodepointToUtf8(cp);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

const std::string& ByteToUnicode(uint8_t b) {
  return Tables().byte_to_utf8[b];
}

int UnicodeToByte(uint32_t cp) {
  return cp < 512 ? Tables().cp_to_byte[cp] : -1;
}

std::string ByteLevelEncode(std::string_view text) {
  const auto& t = Tables();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += t.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

std::string ByteLevelDecode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const size_t start = pos;
    uint32_t cp;
    if (!DecodeUtf8(token, &pos, &cp)) {
      out.push_back(token[start]);
      continue;
    }
    const int b = UnicodeToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(token.substr(start, pos - start));
    }
  }
  return out;
}

}  // namespace stoke::tok
