# fuzz/fuzz.mk — builds the libFuzzer harnesses; GNU make, run by the top
# Makefile's `make fuzz` (Makefile.am), which passes what configure found:
#   srcdir FUZZ_CC FUZZ_CPPFLAGS FUZZ_WARN FUZZ_LIBS LIB_SOURCES AR RANLIB V
# Automake's Makefile stays portable; this one may use GNU make's pattern
# rules and functions, and clang's dependency files, so that an edited
# header rebuilds exactly what includes it.
#
# The library's sources (LIB_SOURCES, the .c of libsubtrain_la_SOURCES)
# are compiled again with the fuzzer's coverage and the sanitizers into
# fuzz/obj/, archived as fuzz/libsubtrain-fuzz.a, from which a harness
# links only the members it reaches.  Left out: the two sources of the
# training loop that use OpenMP's parallel regions (Debian's clang has no
# OpenMP without libomp-dev, and no harness reaches them).  The model's
# sizing memo asks the OpenMP runtime its thread count: the harnesses
# link GCC's runtime, which oneDNN loads anyway (FUZZ_OMP_LIBS).

HARNESSES := idx safetensors options cifar text config
FUZZ_OMP_LIBS := -l:libgomp.so.1
OMP_SOURCES := src/train/train.c src/train/trainer.c
SOURCES := $(filter-out $(OMP_SOURCES),$(filter %.c,$(LIB_SOURCES))) \
	src/cli/options.c src/cli/option_table.c src/cli/option_values.c src/cli/config_file.c \
	src/cli/cli_util.c
OBJECTS := $(SOURCES:%.c=fuzz/obj/%.o)
ARCHIVE := fuzz/libsubtrain-fuzz.a
PROGRAMS := $(HARNESSES:%=fuzz/fuzz_%)

SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all
# clang's -Wshadow also counts glibc's optopt (cli_util.c's parameter);
# its OpenMP pragmas are ignored (no harness runs a parallel region)
CFLAGS := -g -O1 -fno-omit-frame-pointer $(SANITIZE) $(FUZZ_WARN) -Wno-shadow \
	-Wno-unknown-pragmas

# silent rules, as automake's: V=1 shows the commands
ifeq ($(V),1)
Q :=
say = @:
else
Q := @
say = @printf '  %-8s %s\n'
endif

all: $(PROGRAMS)

fuzz/obj/%.o: $(srcdir)/%.c
	@mkdir -p $(@D)
	$(say) FUZZCC $@
	$(Q)$(FUZZ_CC) $(FUZZ_CPPFLAGS) $(CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

$(ARCHIVE): $(OBJECTS)
	$(say) AR $@
	$(Q)rm -f $@ && $(AR) cr $@ $^ && $(RANLIB) $@

fuzz/fuzz_%: fuzz/obj/fuzz/fuzz_%.o $(ARCHIVE)
	$(say) FUZZLD $@
	$(Q)$(FUZZ_CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(FUZZ_LIBS) $(FUZZ_OMP_LIBS)

.SECONDARY:
.PHONY: all

-include $(OBJECTS:.o=.d) $(HARNESSES:%=fuzz/obj/fuzz/fuzz_%.d)
