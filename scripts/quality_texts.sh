#!/usr/bin/env bash
# The twelve real texts of the quality measurements on real models
# (scripts/gemma_quality.sh, scripts/smollm2_quality.sh; sourced): eight
# licences of /usr/share/common-licenses, two CMake manuals, dpkg's trigger
# specification and a zlib example in C — every Debian 12 machine with the
# project's set-up has them. Sets L (the licences' folder) and texts.
L=/usr/share/common-licenses
texts=("$L/GPL-1" "$L/GPL-2" "$L/GPL-3" "$L/LGPL-2.1" "$L/MPL-1.1" "$L/MPL-2.0" "$L/Apache-2.0" "$L/GFDL-1.3"
       /usr/share/cmake-3.25/Help/manual/cmake-buildsystem.7.rst /usr/share/cmake-3.25/Help/manual/cmake-language.7.rst
       /usr/share/doc/dpkg/spec/triggers.txt /usr/share/doc/zlib1g-dev/examples/gzjoin.c)
