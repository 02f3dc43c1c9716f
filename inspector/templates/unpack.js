/* plotly.js packed as LZMA (the "alone" format of xz's lzma) in base 85: unpacked here, in the page,
   with no request. The decoder follows the LZMA specification (lzma-specification.txt, LzmaSpec.cpp). */
var unpackReport = (function () {
  "use strict";
  function base85(text, alphabet, length) {
    var digit = new Int16Array(128).fill(-1), out = new Uint8Array(Math.ceil(length / 4) * 4), o = 0, n = 0, v = 0;
    for (var i = 0; i < alphabet.length; i++) digit[alphabet.charCodeAt(i)] = i;
    for (var j = 0; j < text.length; j++) {
      var d = digit[text.charCodeAt(j)];
      if (d < 0) continue;  /* a line break */
      v = v * 85 + d;
      if (++n === 5) { out[o] = v / 16777216 & 255; out[o + 1] = v >>> 16 & 255; out[o + 2] = v >>> 8 & 255;
                       out[o + 3] = v & 255; o += 4; n = 0; v = 0; }
    }
    return out.subarray(0, length);
  }
  function lzma(input, size) {
    var props = input[0], lc = props % 9, lp = Math.floor(props / 9) % 5, pb = Math.floor(props / 45);
    var out = new Uint8Array(size), pos = 0, ip = 13, range = 0xFFFFFFFF, code = 0;
    for (var k = 0; k < 5; k++) code = (code * 256 + input[ip++]) >>> 0;
    function probs(n) { return new Uint16Array(n).fill(1024); }
    function bit(p, i) {
      var bound = (range >>> 11) * p[i], b;
      if (code < bound) { p[i] += (2048 - p[i]) >>> 5; range = bound; b = 0; }
      else { p[i] -= p[i] >>> 5; code -= bound; range -= bound; b = 1; }
      if (range < 16777216) { range = (range << 8) >>> 0; code = ((code << 8) | input[ip++]) >>> 0; }
      return b;
    }
    function direct(n) {
      var r = 0;
      while (n--) {
        range >>>= 1;
        if (code >= range) { code -= range; r = r * 2 + 1; } else r = r * 2;
        if (range < 16777216) { range = (range << 8) >>> 0; code = ((code << 8) | input[ip++]) >>> 0; }
      }
      return r;
    }
    function tree(p, base, n) { var m = 1; for (var i = 0; i < n; i++) m = (m << 1) + bit(p, base + m); return m - (1 << n); }
    function reverse(p, base, n) {
      var m = 1, s = 0;
      for (var i = 0; i < n; i++) { var b = bit(p, base + m); m = (m << 1) + b; s |= b << i; }
      return s;
    }
    function lenCoder() { return {choice: probs(2), low: probs(16 << 3), mid: probs(16 << 3), high: probs(256)}; }
    function len(c, ps) {
      if (!bit(c.choice, 0)) return tree(c.low, ps << 3, 3);
      if (!bit(c.choice, 1)) return 8 + tree(c.mid, ps << 3, 3);
      return 16 + tree(c.high, 0, 8);
    }
    var literal = probs(0x300 << (lc + lp)), isMatch = probs(192), isRep = probs(12), isRepG0 = probs(12),
        isRepG1 = probs(12), isRepG2 = probs(12), isRep0Long = probs(192), slots = probs(4 << 6),
        posCoders = probs(115), align = probs(16), lenC = lenCoder(), repLenC = lenCoder();
    var state = 0, rep0 = 0, rep1 = 0, rep2 = 0, rep3 = 0, pbMask = (1 << pb) - 1, lpMask = (1 << lp) - 1;
    while (pos < size) {
      var ps = pos & pbMask, l;
      if (!bit(isMatch, (state << 4) + ps)) {
        var prev = pos ? out[pos - 1] : 0, base = 0x300 * (((pos & lpMask) << lc) + (prev >>> (8 - lc))), sym = 1;
        if (state >= 7) {
          var mb = out[pos - rep0 - 1];
          do {
            var mbit = (mb >>> 7) & 1; mb <<= 1;
            var b = bit(literal, base + ((1 + mbit) << 8) + sym);
            sym = (sym << 1) | b;
            if (mbit !== b) break;
          } while (sym < 0x100);
        }
        while (sym < 0x100) sym = (sym << 1) | bit(literal, base + sym);
        out[pos++] = sym - 0x100;
        state = state < 4 ? 0 : state < 10 ? state - 3 : state - 6;
        continue;
      }
      if (bit(isRep, state)) {
        if (!bit(isRepG0, state)) {
          if (!bit(isRep0Long, (state << 4) + ps)) {
            state = state < 7 ? 9 : 11; out[pos] = out[pos - rep0 - 1]; pos++; continue;
          }
        } else {
          var dist;
          if (!bit(isRepG1, state)) dist = rep1;
          else { if (!bit(isRepG2, state)) dist = rep2; else { dist = rep3; rep3 = rep2; } rep2 = rep1; }
          rep1 = rep0; rep0 = dist;
        }
        l = len(repLenC, ps);
        state = state < 7 ? 8 : 11;
      } else {
        rep3 = rep2; rep2 = rep1; rep1 = rep0;
        l = len(lenC, ps);
        state = state < 7 ? 7 : 10;
        var slot = tree(slots, (l < 3 ? l : 3) << 6, 6);
        if (slot < 4) rep0 = slot;
        else {
          var nd = (slot >>> 1) - 1, d0 = (2 | (slot & 1)) * Math.pow(2, nd);
          if (slot < 14) rep0 = d0 + reverse(posCoders, d0 - slot, nd);
          else rep0 = d0 + direct(nd - 4) * 16 + reverse(align, 0, 4);
          if (rep0 === 0xFFFFFFFF) break;  /* the end marker */
        }
        if (rep0 >= pos) throw new Error("the packed plotly.js is damaged");
      }
      for (l += 2; l > 0 && pos < size; l--, pos++) out[pos] = out[pos - rep0 - 1];
    }
    return out;
  }
  return function (element) {
    var packed = base85(element.textContent, element.dataset.alphabet, +element.dataset.packed);
    return new TextDecoder().decode(lzma(packed, +element.dataset.size));
  };
})();
