#!/bin/bash
# usage: run_one.sh NAME PY SCRIPT PROJECT
NAME=$1 PY=$2 SCRIPT=$3 PROJECT=$4
case $PY in py311) VENV=/work/main/.venv;; py313) VENV=/work/main/.venv313;; esac
D=/tmp/art-examples/run-$NAME-$PY
if [ -e /work/main/.art/$PROJECT ]; then echo "REFUSING: /work/main/.art/$PROJECT exists before the run"; exit 99; fi
rm -rf /tmp/art-examples/s3 $D/.art $D/s3-after $D/art-after $D/aws-calls.log; mkdir -p /tmp/art-examples/s3
[ -n "$SEED_S3" ] && cp -r $SEED_S3/. /tmp/art-examples/s3/ && echo "fake S3 seeded from $SEED_S3" > $D/seed.txt
cd $D
CODE_BEFORE="HEAD $(git -C /work/main rev-parse --short HEAD), uncommitted artmlx diff sha1 $(git -C /work/main diff -- artmlx | sha1sum | cut -c1-12)"
START=$(date +%s.%N)
env PATH=/tmp/art-examples/bin:$PATH FAKE_S3_ROOT=/tmp/art-examples/s3 BACKUP_BUCKET=bucket \
    AWS_ON_DISK_LOG=$D/aws-calls.log PYTHONUNBUFFERED=1 $EXTRA_ENV \
    timeout 600 $VENV/bin/python $SCRIPT > $D/run.log 2>&1
RC=$?
END=$(date +%s.%N)
WALL=$(python3 -c "print(f'{$END-$START:.1f}')")
{
echo "rc=$RC wall_s=$WALL"
echo "started $(date -d @${START%.*} -u +%H:%M:%S) UTC; artmlx code before: $CODE_BEFORE; after: HEAD $(git -C /work/main rev-parse --short HEAD), uncommitted artmlx diff sha1 $(git -C /work/main diff -- artmlx | sha1sum | cut -c1-12)"
echo "cmd: cd $D && PATH=/tmp/art-examples/bin:\$PATH FAKE_S3_ROOT=/tmp/art-examples/s3 BACKUP_BUCKET=bucket PYTHONUNBUFFERED=1 timeout 600 $VENV/bin/python $SCRIPT"
echo "--- .art locations:"; ls -d $D/.art /tmp/art-examples/.art /tmp/.art /work/main/.art/$PROJECT 2>/dev/null
echo "--- terminate called: $(grep -c 'terminate called' $D/run.log)"
} > $D/summary.txt
for A in $D/.art/$PROJECT /work/main/.art/$PROJECT; do
  if [ -e $A ]; then echo "--- find $A" >> $D/summary.txt; (cd $A && find . | sort) >> $D/summary.txt; cp -r $A $D/art-after; fi
done
[ -e /work/main/.art/$PROJECT ] && rm -rf /work/main/.art/$PROJECT && echo "--- removed /work/main/.art/$PROJECT after copying it to $D/art-after" >> $D/summary.txt
echo "--- aws calls:" >> $D/summary.txt; cat $D/aws-calls.log >> $D/summary.txt 2>/dev/null
echo "--- fake s3:" >> $D/summary.txt; (cd /tmp/art-examples/s3 && find . -maxdepth 7 | sort) >> $D/summary.txt
mv /tmp/art-examples/s3 $D/s3-after
cat $D/summary.txt
