/*
 * bcryptprimitives.dll shim for Wine 8.0 (Debian bookworm).
 *
 * Go 1.22 and later read random bytes at start-up through ProcessPrng,
 * exported by bcryptprimitives.dll since Windows 10. Wine 8.0 does not
 * ship that DLL, so a Go program dies before main. This DLL exports
 * ProcessPrng and fills the buffer with RtlGenRandom (advapi32's
 * SystemFunction036), which Wine has. It is built and installed only
 * into the throwaway Wine prefix of .ci/wine.sh; it never ships.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buf, ULONG len);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
	/* RtlGenRandom takes a ULONG: feed it in pieces. */
	while (len > 0) {
		ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
		if (!SystemFunction036(data, n))
			return FALSE;
		data += n;
		len -= n;
	}
	return TRUE;
}
